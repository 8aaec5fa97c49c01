"""CPU INT8 stage: real ORT quantization, and ORT's own optimizer showing the integer kernels it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from pipeline.backend.onnxrt import session_from_onnx
from pipeline.core.errors import PipelineError
from pipeline.data.tensors import signature_from_onnx
from pipeline.stages.calibration import calibration_from_path
from pipeline.stages.int8 import check_qdq_int8_symmetric, qdq_onnx_from_onnx
from pipeline.stages.int8_cpu import check_qdq_uint8_activations, cpu_int8_onnx_from_onnx


@pytest.fixture(scope="module")
def cpu_int8(digits_convnet: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = calibration_from_path(digits_convnet.calib, signature_from_onnx(digits_convnet.model))
    return cpu_int8_onnx_from_onnx(digits_convnet.model, tmp_path_factory.mktemp("cpu-int8") / "int8cpu.onnx", data)


def _consts(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def test_uint8_activations_int8_weights_int32_bias_float_softmax(cpu_int8: Path) -> None:
    check_qdq_uint8_activations(cpu_int8)
    model = onnx.load(str(cpu_int8))
    consts = _consts(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    for q in (n for n in model.graph.node if n.op_type == "QuantizeLinear"):
        assert consts[q.input[2]].dtype == np.uint8, q.name  # activations: uint8 with their own zero point
    assert any(consts[q.input[2]] != 0 for q in model.graph.node if q.op_type == "QuantizeLinear")  # asymmetric ranges
    for layer, channels in (("conv", 8), ("head", 10)):
        node = next(n for n in model.graph.node if n.name == layer)
        weight, bias = producers[node.input[1]], producers[node.input[2]]
        assert weight.op_type == "DequantizeLinear" and consts[weight.input[0]].dtype == np.int8
        assert consts[weight.input[1]].shape == (channels,) and not consts[weight.input[2]].any()  # per channel, zero point 0
        assert bias.op_type == "DequantizeLinear" and consts[bias.input[0]].dtype == np.int32
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    assert softmax.output[0] == model.graph.output[0].name  # the probabilities stay float
    assert {o.domain for o in model.opset_import} == {""}


def test_ort_runs_it_as_integer_kernels_with_graph_optimizations_on(cpu_int8: Path, tmp_path: Path) -> None:
    """What makes it fast: at ORT's default level every Conv/Gemm of the Q/DQ graph becomes an integer kernel."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED  # ALL adds layout ops only this CPU has
    ort.InferenceSession(str(cpu_int8), options, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert "QLinearConv" in ops and "Conv" not in ops, ops
    assert not {"Gemm", "MatMul"} & set(ops), ops  # the head too (QLinearMatMul / MatMulIntegerToFloat / QGemm)


def test_accuracy_as_served_within_one_point_of_fp32(cpu_int8: Path, digits_convnet: Any) -> None:
    probs = session_from_onnx(cpu_int8).run(None, {"image": digits_convnet.eval_images})[0]  # graph optimizations on, as served
    accuracy = float((probs.argmax(1) == digits_convnet.eval_labels).mean())
    assert accuracy >= digits_convnet.fp32_accuracy - 0.01
    fp32 = session_from_onnx(digits_convnet.model).run(None, {"image": digits_convnet.eval_images})[0]
    assert 0 < np.abs(probs - fp32).max() < 0.2  # quantized for real, but close


def test_the_checks_tell_the_tensorrt_and_cpu_forms_apart(cpu_int8: Path, digits_convnet: Any, tmp_path: Path) -> None:
    data = calibration_from_path(digits_convnet.calib, signature_from_onnx(digits_convnet.model))
    tensorrt = qdq_onnx_from_onnx(digits_convnet.model, tmp_path / "int8.onnx", data)
    with pytest.raises(PipelineError, match="not symmetric int8 Q/DQ: .*zero point is uint8"):
        check_qdq_int8_symmetric(cpu_int8)
    with pytest.raises(PipelineError, match="is not a CPU INT8 model .*does not quantize to uint8"):
        check_qdq_uint8_activations(tensorrt)
    with pytest.raises(PipelineError, match="has no QuantizeLinear nodes"):
        check_qdq_uint8_activations(digits_convnet.model)


def test_keep_nodes_stay_float(digits_convnet: Any, tmp_path: Path) -> None:
    data = calibration_from_path(digits_convnet.calib, signature_from_onnx(digits_convnet.model))
    out = cpu_int8_onnx_from_onnx(digits_convnet.model, tmp_path / "kept.onnx", data, keep_nodes=["head"])
    model = onnx.load(str(out))
    producers = {o: n for n in model.graph.node for o in n.output}
    head = next(n for n in model.graph.node if n.name == "head")
    assert head.input[1] not in producers and _consts(model)[head.input[1]].dtype == np.float32  # the float weight itself
    conv = next(n for n in model.graph.node if n.name == "conv")
    assert producers[conv.input[1]].op_type == "DequantizeLinear"
