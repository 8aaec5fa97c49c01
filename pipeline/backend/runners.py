"""Polygraphy runners for every kind of model the pipeline compares.

The SavedModel runner is ours (Polygraphy's TfRunner is TF1-graph only); ONNX runs through
Polygraphy's OnnxrtRunner over our session factory, so INT8 Q/DQ models can be evaluated with
the semantics TensorRT implements; TensorRT plans through Polygraphy's TrtRunner (engine stage).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from pipeline.core.lazy import import_tensorflow
from pipeline.data.tensors import SIGNATURE


class SavedModelRunner(BaseRunner):
    """Runs a SavedModel's ``serving_default`` signature with TensorFlow 2."""

    def __init__(self, saved: Path, name: str | None = None) -> None:
        super().__init__(name=name, prefix="tf-savedmodel-runner")
        self._saved = Path(saved)
        self._fn: Any = None

    def activate_impl(self) -> None:
        tf = import_tensorflow("Running the SavedModel for the parity check")

        self._fn = tf.saved_model.load(str(self._saved)).signatures[SIGNATURE]

    def get_input_metadata_impl(self) -> TensorMetadata:
        meta = TensorMetadata()
        for name, spec in self._fn.structured_input_signature[1].items():
            meta.add(name, np.dtype(spec.dtype.as_numpy_dtype), tuple(-1 if d is None else d for d in spec.shape))
        return meta

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> "OrderedDict[str, np.ndarray]":
        import tensorflow as tf

        started = time.perf_counter()
        outputs = self._fn(**{k: tf.constant(v) for k, v in feed_dict.items()})
        result = OrderedDict((k, v.numpy()) for k, v in outputs.items())
        self.inference_time = time.perf_counter() - started  # Polygraphy reports it per iteration
        return result

    def deactivate_impl(self) -> None:
        self._fn = None


def runner_for_onnx(path: Path, *, exact_qdq: bool = False, name: str | None = None) -> BaseRunner:
    """A Polygraphy OnnxrtRunner; ``exact_qdq`` evaluates Q/DQ as TensorRT does (see pipeline.backend.onnxrt)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from pipeline.backend.onnxrt import session_from_onnx

    return OnnxrtRunner(lambda: session_from_onnx(path, exact_qdq=exact_qdq), name=name)
