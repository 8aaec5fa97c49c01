"""CPU INT8 ONNX variant: the model quantized the way ONNX Runtime's x86 integer kernels run fast.

The TensorRT artifact (``model.int8.onnx``, :mod:`pipeline.stages.int8`) is symmetric int8
everywhere, with Q/DQ only on weighted layers' inputs: what TensorRT wants, but ORT's CPU kernels
have no fast path for signed activations, and with graph optimizations on they run it slower
than FP32 (MobileNetV2 224, batch 32, 2 threads: 0.44×). This variant is the same FP32 model,
calibrated on the same data with the same method, quantized for those kernels:

* **uint8 activations with a zero point** (asymmetric ranges: the calibrator records low and high
  of every float tensor), **int8 weights** per output channel (zero point 0), **int32 biases**:
  the u8×s8 form of ORT's QLinearConv/QLinearMatMul, which use VNNI where the CPU has it;
* **Q/DQ around every op ORT can quantize** (Conv, MatMul, Add, pooling, Concat, reshapes, …), so
  with graph optimizations on the chains fuse into QLinear* kernels and the activations stay uint8
  between them instead of going back to float at every layer;
* Softmax, LogSoftmax and LayerNormalization stay float (the ops the FP16 variant keeps in FP32:
  probabilities and normalisations lose most to rounding), and so do the layers that compute graph
  outputs (a regression head rounded to uint8 lost its 0.99 cosine gate: 0.987 on the zoo's two_heads).

It is served with ORT's graph optimizations at their default level (ORT_ENABLE_ALL; the Triton
config leaves ``optimization.graph`` unset) on CPU instances, and gated in that same session
configuration (:func:`pipeline.backend.onnxrt.session_from_onnx` without ``exact_qdq``): the fused integer
kernels' numbers are the ones judged, not the Q/DQ graph's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.backend.budget import DEFAULT_MAX_MEMORY_GIB
from pipeline.backend.cpu_kernels import record_cpu_kernels
from pipeline.core.errors import PipelineError, require
from pipeline.stages.calibration import CalibrationData
from pipeline.stages.fp16 import DEFAULT_FP32_OPS
from pipeline.stages.int8 import output_layers, quantized_onnx_from_onnx
from pipeline.stages.int8_calibrate import QuantRecipe

log = logging.getLogger(__name__)


def check_qdq_uint8_activations(path: Path, _cache: Path | None = None) -> None:
    """Raise PipelineError unless the model quantizes activations to uint8 (QuantizeLinear with a uint8
    zero point) and stores weights as int8 initializers: the form ORT's fast CPU kernels take."""
    import onnx
    from onnx import numpy_helper

    path = Path(path)
    require(path.is_file(), f"ONNX model '{path}' does not exist")
    graph = onnx.load(str(path)).graph
    consts = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    quantize = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    problems = []
    if not quantize:
        problems.append("it has no QuantizeLinear nodes")
    for node in quantize:
        zp = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if zp is None or zp.dtype != np.uint8:
            problems.append(f"QuantizeLinear '{node.name or node.output[0]}' does not quantize to uint8")
    for node in graph.node:
        source = consts.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if source is not None and source.dtype not in (np.int8, np.uint8, np.int32):
            problems.append(f"DequantizeLinear '{node.name or node.output[0]}' reads a {source.dtype} initializer")
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise PipelineError(
            f"'{path}' is not a CPU INT8 model (uint8 activations, int8 weights): {shown}",
            "quantize the FP32 model again with cpu_int8_onnx_from_onnx",
        )


def _finish_for_cpu(path: Path, _cache: Path) -> None:
    check_qdq_uint8_activations(path)
    record_cpu_kernels(path)


# Where ORT's CPU integer kernels pay: the weighted layers, and the ops its QDQ fusions keep in uint8 between
# them (ReLU/Clip folded into the range, residual Adds as QLinearAdd, pooling, Concat, data movement). Everything
# else (Mul, Sigmoid, Softmax, normalisations, Gather of embeddings, Resize, ...) stays float: quantized there it
# costs accuracy and buys no kernel. ConvTranspose has no integer CPU kernel in ORT's default build.
CPU_QUANTIZED_OP_TYPES = ("Conv", "MatMul", "Gemm", "Relu", "Clip", "Add", "MaxPool", "AveragePool", "GlobalAveragePool", "Concat",
                          "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze")
CPU_WEIGHT_BITS = 7


def cpu_float_nodes(model_path: Path) -> set[str]:
    """Nodes of the prepared model the CPU recipe keeps float: the layers that compute graph outputs (a regression
    head rounded to uint8 lost its 0.99 cosine gate), and Adds of a constant (a bias rounded to the activation's
    uint8 step instead of the int32 one its MatMul would give it)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    constants = {init.name for init in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    bias_adds = {n.name for n in graph.node if n.op_type == "Add" and any(i in constants for i in n.input)}
    return output_layers(model_path) | bias_adds


CPU_RECIPE = QuantRecipe(
    label="CPU INT8",
    symmetric=False,  # uint8 activations take the tensor's own low/high, zero point included
    calibrated_op_types=(),  # every float tensor: every quantized op gets its own range
    op_types_to_quantize=CPU_QUANTIZED_OP_TYPES,
    float_op_types=DEFAULT_FP32_OPS,
    float_nodes=cpu_float_nodes,
    weight_bits=CPU_WEIGHT_BITS,
    activation_type="QUInt8",
    extra_options={
        "ActivationSymmetric": False,
        "WeightSymmetric": True,  # int8 weights with zero point 0: the s8 side of ORT's u8s8 kernels
        # int32 biases (ORT's default): QLinearConv takes them as they are.
        "QuantizeBias": True,
    },
    finish=_finish_for_cpu,
)


def cpu_int8_onnx_from_onnx(
    src: Path,
    dst: Path,
    calibration: CalibrationData,
    *,
    method: str = "percentile",
    percentile: float = 99.999,
    batch_size: int | None = None,
    max_memory_gib: float = DEFAULT_MAX_MEMORY_GIB,
    keep_nodes: Sequence[str] = (),
) -> Path:
    """Write the CPU INT8 variant of the FP32 ONNX model ``src`` to ``dst`` and return ``dst``.

    The arguments are those of :func:`pipeline.stages.int8.qdq_onnx_from_onnx` (calibration method,
    memory-budgeted batches, ``keep_nodes`` left in float); the result is checked with ``onnx.checker``
    and :func:`check_qdq_uint8_activations`. Evaluate and serve it with ORT's graph optimizations on.
    """
    return quantized_onnx_from_onnx(src, dst, calibration, CPU_RECIPE, method=method, percentile=percentile,
                                    batch_size=batch_size, max_memory_gib=max_memory_gib, keep_nodes=keep_nodes)
