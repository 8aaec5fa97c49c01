"""ONNX Runtime sessions for the pipeline's models (CPU), with Q/DQ evaluated as TensorRT does."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.errors import PipelineError, require
from pipeline.data.tensors import dequantizes_a_table

if TYPE_CHECKING:
    import onnx
    import onnxruntime

log = logging.getLogger(__name__)


def session_from_onnx(
    path: Path, *, exact_qdq: bool = False, threads: int | None = None
) -> onnxruntime.InferenceSession:
    """An ONNX Runtime CPU session for the model at ``path``.

    ``exact_qdq=True`` turns every graph optimization off (``ORT_DISABLE_ALL``), so each
    QuantizeLinear/DequantizeLinear pair runs as written: the tensor is rounded to int8 and
    scaled back to float, and the Conv/Gemm/MatMul after it runs in FP32 on those values with
    its float bias. That is the arithmetic TensorRT implements for an explicitly quantized
    network, so accuracy measured this way predicts the TensorRT INT8 engine. With
    optimizations on, ORT rewrites the Q/DQ graph for its own integer kernels and the numbers
    change: already at the basic level it quantizes float biases to int32 (rounding them to
    the input×weight scale) and moves Q/DQ pairs across pooling/reshapes; at higher levels it
    fuses DQ→op→Q into QLinearConv/QLinearMatMul/MatMulIntegerToFloat, whose u8×s8 path on
    x86 CPUs without VNNI goes through saturating 16-bit sums. (On the default digits model
    the optimized session's probabilities differ by up to 0.05 from the exact ones.) Use it
    for INT8 accuracy gates; leave it off for FP32/FP16 models and for CPU speed.

    ``threads`` sets the intra-op thread count (default: ORT's choice, all cores).

    Memory patterns are off: with them, ORT plans one block per input shape after the first run
    and allocates it on the second while its arena still holds the first run's buffers, so peak
    memory doubles (ResNet50 at batch 13: 3.0 GB instead of 1.5 GB). Without them the arena
    reuses its buffers from batch to batch.
    """
    import onnxruntime as ort

    path = Path(path)
    require(path.is_file(), f"ONNX model '{path}' does not exist", "build it first, or check the path")
    require(threads is None or threads >= 1, f"threads must be at least 1, got {threads}", "pass a positive number or None")

    options = ort.SessionOptions()
    options.enable_mem_pattern = False
    if exact_qdq:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        # An int8 embedding table in TensorRT's form is dequantized whole on every run: without the arena that block is
        # returned after each run instead of kept (and a second one added): 0.6 GB instead of 4.7 GB for a 2 GB table.
        options.enable_cpu_mem_arena = not dequantizes_a_table(path)
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises its own pybind types (Fail, InvalidGraph, ...)
        raise PipelineError(
            f"ONNX Runtime cannot load '{path}': {str(exc).strip().splitlines()[0]}",
            "check that the file is a complete ONNX model (re-export it), and that its opset is supported",
        ) from None
    log.debug("ORT session for %s (exact_qdq=%s, threads=%s)", path, exact_qdq, threads)
    return session


def session_from_proto(model: onnx.ModelProto, folder: Path, *, exact_qdq: bool = False) -> onnxruntime.InferenceSession:
    """An ONNX Runtime CPU session for ``model`` as changed in memory (outputs marked, inputs bypassed), whose external
    tensors ONNX Runtime reads from their data files in ``folder``: the weights are neither loaded into the proto nor
    written again, and a model over 2 GB works as a small one. Options as :func:`session_from_onnx`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_mem_pattern = False
    if exact_qdq:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    return ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])
