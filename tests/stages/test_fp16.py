"""FP16 stage: real conversion, checked with onnx.checker and run in ONNX Runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from pipeline.errors import PipelineError
from pipeline.onnxrt import session_from_onnx
from pipeline.stages.fp16 import fp16_onnx_from_onnx

vi = helper.make_tensor_value_info


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    graph = inferred.graph
    return {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}


def test_digits_fp16_keeps_fp32_io_and_softmax(digits_convnet: Any, tmp_path: Path) -> None:
    out = fp16_onnx_from_onnx(digits_convnet.model, tmp_path / "fp16.onnx")
    model = onnx.load(str(out))
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    weights = {i.name: i.data_type for i in model.graph.initializer}
    assert weights["conv_w"] == weights["head_w"] == TensorProto.FLOAT16
    types = _elem_types(model)
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    assert types[softmax.input[0]] == TensorProto.FLOAT
    assert softmax.output[0] == "probs"  # writes the graph output in FP32, no fp16 round trip
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert types[conv.output[0]] == TensorProto.FLOAT16

    fp32 = session_from_onnx(digits_convnet.model).run(None, {"image": digits_convnet.eval_images})[0]
    fp16 = session_from_onnx(out).run(None, {"image": digits_convnet.eval_images})[0]
    assert fp16.dtype == np.float32
    assert 0 < np.abs(fp16 - fp32).max() < 0.01
    assert (fp16.argmax(1) == fp32.argmax(1)).mean() > 0.99


def _token_model(save_model: Any, path: Path, *, named: bool) -> Path:
    """ids + mask (int64) and a float input; two float outputs, one from the kept-FP32 Softmax."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"]),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last"], ["mask_3d"]),
        helper.make_node("Mul", ["emb", "mask_3d"], ["masked"]),
        helper.make_node("ReduceMean", ["masked"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "w"], ["h"]),
        helper.make_node("Add", ["h", "bias_in"], ["logits_raw"]),
        helper.make_node("Softmax", ["logits_raw"], ["probs"], axis=-1),
        helper.make_node("Sub", ["logits_raw", "bias_in"], ["shifted"]),  # 2nd consumer of a float input
        helper.make_node("Relu", ["shifted"], ["relu"]),
    ]
    if named:
        for index, node in enumerate(nodes):
            node.name = f"n{index}"
    return save_model(
        path,
        nodes,
        [
            vi("ids", TensorProto.INT64, ["batch", 5]),
            vi("mask", TensorProto.INT64, ["batch", 5]),
            vi("bias_in", TensorProto.FLOAT, ["batch", 3]),
        ],
        [vi("probs", TensorProto.FLOAT, ["batch", 3]), vi("relu", TensorProto.FLOAT, ["batch", 3])],
        {
            "table": rng.standard_normal((20, 6)).astype(np.float32),
            "w": rng.standard_normal((6, 3)).astype(np.float32),
            "last": np.array([2], np.int64),
        },
    )


@pytest.mark.parametrize("named", [True, False])
def test_integer_inputs_casts_and_several_outputs(tmp_path: Path, onnx_file: Any, named: bool) -> None:
    src = _token_model(onnx_file, tmp_path / "tokens.onnx", named=named)
    out = fp16_onnx_from_onnx(src, tmp_path / "tokens_fp16.onnx")
    model = onnx.load(str(out))
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [TensorProto.INT64, TensorProto.INT64, TensorProto.FLOAT]
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [TensorProto.FLOAT, TensorProto.FLOAT]
    assert {i.name: i.data_type for i in model.graph.initializer}["table"] == TensorProto.FLOAT16

    rng = np.random.default_rng(1)
    feed = {
        "ids": rng.integers(0, 20, (6, 5)),
        "mask": rng.integers(0, 2, (6, 5)),
        "bias_in": rng.standard_normal((6, 3)).astype(np.float32),
    }
    fp32 = session_from_onnx(src).run(None, feed)
    fp16 = session_from_onnx(out).run(None, feed)
    for a, b in zip(fp32, fp16, strict=True):
        assert b.dtype == np.float32
        np.testing.assert_allclose(b, a, atol=5e-3)


def test_keep_fp32_ops_is_honoured(tmp_path: Path, onnx_file: Any) -> None:
    src = _token_model(onnx_file, tmp_path / "tokens.onnx", named=True)
    out = fp16_onnx_from_onnx(src, tmp_path / "fp16.onnx", keep_fp32_ops=("Softmax", "MatMul"))
    model = onnx.load(str(out))
    weights = {i.name: i.data_type for i in model.graph.initializer}
    assert weights["w"] == TensorProto.FLOAT  # MatMul weight left in FP32
    assert weights["table"] == TensorProto.FLOAT16
    assert _elem_types(model)[next(n for n in model.graph.node if n.op_type == "MatMul").input[0]] == TensorProto.FLOAT


def test_user_errors(tmp_path: Path, digits_convnet: Any) -> None:
    with pytest.raises(PipelineError, match="does not exist"):
        fp16_onnx_from_onnx(tmp_path / "missing.onnx", tmp_path / "out.onnx")
    once = fp16_onnx_from_onnx(digits_convnet.model, tmp_path / "once.onnx")
    with pytest.raises(PipelineError, match="cannot convert .* to FP16: The model is already converted"):
        fp16_onnx_from_onnx(once, tmp_path / "twice.onnx")
    assert not (tmp_path / "twice.onnx").exists()
