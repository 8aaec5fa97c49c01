"""A uint8 wire format for image models: the FP32 model with its image inputs taking ``uint8`` NHWC and
the scaling folded into the graph (``--uint8-input SCALE``, published as ``<name>_u8``).

Each float image input (rank 4, channels last: 1, 3 or 4) becomes ``uint8`` and feeds ``Cast(float) →
Mul(SCALE)`` in front of the nodes that read it, so the graph computes on ``uint8 × SCALE``: a quarter of
the bytes per request for the same model. A model that normalizes its input itself (a Keras
``Rescaling`` layer: it takes 0..255) uses ``SCALE`` 1, and the Mul is left out. The scale is recorded
in the model's metadata (:data:`pipeline.data.uint8_wire.SCALE_KEY`), where the build's gate, the publish
stage, ``verify`` and the load tests read it to turn float samples into the uint8 a client sends
(:func:`pipeline.data.uint8_wire.quantized`).

The gate: on the evaluation data turned to uint8, the variant's outputs must equal the FP32 model's on
the same values as floats (``uint8 × SCALE``) within the parity tolerance (:func:`uint8_parity_from_models`):
the graph change alone is judged; what rounding the samples to uint8 costs is the data's business (samples
that are multiples of SCALE lose nothing).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING
from pathlib import Path

import numpy as np

from pipeline.core.errors import CheckFailed, PipelineError, require
from pipeline.core.onnx_files import has_external_data, save_onnx
from pipeline.data.uint8_wire import SCALE_KEY, dequantized, quantized, uint8_scales

if TYPE_CHECKING:
    import onnx

    from pipeline.accuracy.evaldata import EvalData

log = logging.getLogger(__name__)

_CHANNELS = (1, 3, 4)


def image_inputs(model: onnx.ModelProto) -> list[str]:
    """The float inputs of ``model`` shaped like NHWC images (rank 4, last dimension 1, 3 or 4)."""
    from onnx import TensorProto

    found = []
    for value in model.graph.input:
        tensor = value.type.tensor_type
        dims = tensor.shape.dim
        if tensor.elem_type == TensorProto.FLOAT and len(dims) == 4 and dims[3].HasField("dim_value") and dims[3].dim_value in _CHANNELS:
            found.append(value.name)
    return found


def uint8_input_onnx_from_onnx(src: Path, dst: Path, *, scale: float) -> Path:
    """Write ``src`` with every NHWC float image input taking uint8 (``Cast`` and, unless ``scale`` is 1,
    ``Mul(scale)`` in front) to ``dst``; the scales go into the metadata under :data:`SCALE_KEY`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.data.tensors import load_onnx

    require(np.isfinite(scale) and scale > 0, f"--uint8-input scale must be a positive number, got {scale}", "e.g. --uint8-input 0.00392156862745098 (1/255)")
    model = load_onnx(Path(src))
    names = image_inputs(model)
    if not names:
        raise PipelineError(
            f"{src} has no float NHWC image input (rank 4, 1/3/4 channels last) to take as uint8",
            "leave --uint8-input out for this model",
        )
    graph = model.graph
    front = []
    for name in names:
        value = next(v for v in graph.input if v.name == name)
        inner = f"{name}__as_float"
        front.append(helper.make_node("Cast", [name], [inner if scale == 1 else f"{inner}_unscaled"], to=TensorProto.FLOAT, name=f"{name}__cast"))
        if scale != 1:
            graph.initializer.append(numpy_helper.from_array(np.array(scale, dtype=np.float32), f"{name}__scale"))
            front.append(helper.make_node("Mul", [f"{inner}_unscaled", f"{name}__scale"], [inner], name=f"{name}__scale_mul"))
        for node in graph.node:
            node.input[:] = [inner if i == name else i for i in node.input]
        for output in graph.output:
            require(output.name != name, f"input '{name}' of {src} is also a graph output", "leave --uint8-input out for this model")
        value.type.tensor_type.elem_type = TensorProto.UINT8
    nodes = front + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    meta = {p.key: p for p in model.metadata_props}
    entry = meta.get(SCALE_KEY) or model.metadata_props.add(key=SCALE_KEY)
    entry.value = json.dumps({name: scale for name in names})
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_onnx(model, dst, external=has_external_data(Path(src)))
    onnx.checker.check_model(str(dst), full_check=True)  # by path: a model with a data file is checked with it
    log.info("uint8 input: %s take uint8 NHWC, × %g in the graph: %s", ", ".join(names), scale, dst)
    return dst


def uint8_parity_from_models(fp32: Path, u8: Path, data: EvalData, dst: Path, *, atol: float, rtol: float, batch_size: int = 64) -> Path:
    """Gate the uint8 variant: its outputs on ``data``'s samples turned to uint8 against the FP32 model's on
    the same values as floats; write the report to ``dst`` (JSON); raise CheckFailed beyond ``atol + rtol·|FP32|``."""
    from pipeline.backend.onnxrt import session_from_onnx

    scales = uint8_scales(u8)
    require(bool(scales), f"{u8} records no uint8 input scale", "rebuild it with --uint8-input")
    reference, variant = session_from_onnx(fp32), session_from_onnx(u8)
    names = [o.name for o in reference.get_outputs()]
    worst = dict.fromkeys(names, 0.0)
    excess = dict.fromkeys(names, -np.inf)
    samples = 0
    for batch in data.batches(batch_size):
        wire = quantized(batch, scales)
        for name, w, g in zip(names, reference.run(names, dequantized(wire, scales)), variant.run(names, wire), strict=True):
            if w.size:
                worst[name] = max(worst[name], float(np.max(np.abs(g - w))))
                excess[name] = max(excess[name], float(np.max(np.abs(g - w) - (atol + rtol * np.abs(w)))))
        samples += len(next(iter(wire.values())))
    failed = [f"output '{n}' differs by {worst[n]:.3g} (> {atol:g} + {rtol:g}·|FP32|)" for n in names if excess[n] > 0]
    report = {"scales": scales, "samples": samples, "atol": atol, "rtol": rtol,
              "outputs": {n: {"max_abs_diff": worst[n], "passed": excess[n] <= 0} for n in names}}
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(report, indent=2) + "\n")
    if failed:
        raise CheckFailed(f"uint8-input variant {Path(u8).name} fails its parity gate: {'; '.join(failed)} (report: {dst})",
                          "check --uint8-input SCALE against how the model's inputs are scaled")
    log.info("uint8 input: outputs within %g + %g·|FP32| of FP32 on %d samples (max abs diff %s)", atol, rtol, samples,
             ", ".join(f"{n} {worst[n]:.2g}" for n in names))
    return dst
