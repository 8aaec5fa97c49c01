"""The uint8 wire format of image models (``--uint8-input SCALE``, published as ``<name>_u8``): the scale
each uint8 input records in the model (:data:`SCALE_KEY`), float samples turned into the uint8 a client
sends (:func:`quantized`) and back into the values the graph computes on (:func:`dequantized`). The build,
``verify`` and the load tests read and send it the same way; the variant itself is made and gated by
:mod:`pipeline.stages.uint8_input`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pipeline.data.tensors import ModelSignature

SCALE_KEY = "pipeline.uint8_input_scale"  # ONNX metadata_props: JSON {input name: scale}


def uint8_scales(path: Path) -> dict[str, float]:
    """The recorded scale per uint8 input of an ONNX model (empty for a model without them)."""
    from pipeline.data.tensors import load_onnx

    model = load_onnx(Path(path), external_data=False)
    for prop in model.metadata_props:
        if prop.key == SCALE_KEY:
            return {str(k): float(v) for k, v in json.loads(prop.value).items()}
    return {}


def quantized(feed: Mapping[str, np.ndarray], scales: Mapping[str, float]) -> dict[str, np.ndarray]:
    """``feed`` with each float input that has a scale turned into the uint8 a client sends: ``round(x / scale)``
    clipped to 0..255. The others stay as they are: integer samples already are what goes on the wire."""
    out = {}
    for name, array in feed.items():
        scale = scales.get(name)
        if scale is None or np.asarray(array).dtype.kind != "f":
            out[name] = array
        else:
            out[name] = np.clip(np.rint(np.asarray(array, dtype=np.float64) / scale), 0, 255).astype(np.uint8)
    return out


def dequantized(feed: Mapping[str, np.ndarray], scales: Mapping[str, float]) -> dict[str, np.ndarray]:
    """The values the graph computes on: each input that has a scale as float32 ``x × scale`` (the others as they are)."""
    return {k: (v.astype(np.float32) * np.float32(scales[k]) if k in scales else v) for k, v in feed.items()}


def float_inputs(signature: ModelSignature, scales: Mapping[str, float], data: Path) -> ModelSignature:
    """``signature`` as samples in ``data`` (an ``.npz`` or ``.npy`` folder) are read for it: each uint8 input
    that has a scale read as float32 where ``data`` gives it as floats (:func:`quantized` turns them into the
    wire's uint8), as uint8 where it gives integers (they already are what a client sends)."""
    from dataclasses import replace

    from pipeline.data.buckets import BUCKET_SEP, array_headers

    if not scales:
        return signature
    integers = {key.split(BUCKET_SEP)[0] for key, (_, dtype) in array_headers(data).items() if dtype.kind in "iu"}
    floats = set(scales) - integers
    return replace(signature, inputs=tuple(replace(s, dtype=np.dtype(np.float32)) if s.name in floats else s for s in signature.inputs))


def served_uint8_scales(model_dir: Path) -> dict[str, float]:
    """The uint8 input scales of the newest version of a published model (``<model>/<version>/*.onnx``);
    empty when it has none or is not an ONNX model."""
    versions = sorted((int(p.name), p) for p in Path(model_dir).iterdir() if p.is_dir() and p.name.isdigit()) if Path(model_dir).is_dir() else []
    files = sorted(versions[-1][1].glob("*.onnx")) if versions else []
    return uint8_scales(files[0]) if files else {}
