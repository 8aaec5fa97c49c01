"""The uint8-input stage on a real NHWC image model: the graph change, the gate, and that the gate can fail."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.accuracy.evaldata import EvalBucket, EvalData
from pipeline.backend.onnxrt import session_from_onnx
from pipeline.core.errors import CheckFailed, PipelineError
from pipeline.data.uint8_wire import SCALE_KEY, quantized, uint8_scales
from pipeline.stages.uint8_input import uint8_input_onnx_from_onnx, uint8_parity_from_models


def image_model(path: Path, rng: np.random.Generator) -> Path:
    """image float32 [batch,8,8,3] NHWC → Transpose → Conv 3→4 → GlobalAveragePool → Flatten → Softmax → probs [batch,4]."""
    weights = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["image"], ["nchw"], perm=[0, 3, 1, 2]),
            helper.make_node("Conv", ["nchw", "w"], ["conv"], pads=[1, 1, 1, 1]),
            helper.make_node("GlobalAveragePool", ["conv"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        ],
        "image",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 8, 8, 3])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def eval_data(images: np.ndarray) -> EvalData:
    return EvalData((EvalBucket("", {"image": images}),), "test images", "test")


def test_image_inputs_take_uint8_and_the_outputs_equal_fp32_on_the_same_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    fp32 = image_model(tmp_path / "model.fp32.onnx", rng)
    u8 = uint8_input_onnx_from_onnx(fp32, tmp_path / "model.u8.onnx", scale=1 / 255)
    model = onnx.load(str(u8))
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.UINT8
    assert [n.op_type for n in model.graph.node[:2]] == ["Cast", "Mul"]
    assert uint8_scales(u8) == {"image": 1 / 255}

    wire = rng.integers(0, 256, (16, 8, 8, 3), dtype=np.uint8)  # what a client sends: a quarter of FP32's bytes
    got = session_from_onnx(u8).run(["probs"], {"image": wire})[0]
    want = session_from_onnx(fp32).run(["probs"], {"image": wire.astype(np.float32) * np.float32(1 / 255)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    images = rng.integers(0, 256, (40, 8, 8, 3)).astype(np.float32) / 255
    report = uint8_parity_from_models(fp32, u8, eval_data(images), tmp_path / "parity.json", atol=1e-5, rtol=1e-4, batch_size=16)
    assert json.loads(report.read_text())["outputs"]["probs"]["passed"] and json.loads(report.read_text())["samples"] == 40
    np.testing.assert_array_equal(quantized({"image": images}, {"image": 1 / 255})["image"].astype(np.float32) / 255, images)


def test_samples_already_integer_are_sent_as_they_are_and_inputs_without_a_scale_are_left_alone() -> None:
    """uint8 samples (``loadtest --data`` of a uint8-input variant) already are the wire format: dividing them by the
    scale again would send every pixel above 0 as 255."""
    wire = np.array([[0, 1, 128, 255]], dtype=np.uint8)
    floats = np.array([[0.0, 0.3, 0.5, 2.0]], dtype=np.float32)
    out = quantized({"image": wire, "other": floats, "mask": floats}, {"image": 1 / 255, "mask": 0.5})
    assert out["image"] is wire and out["other"] is floats
    assert out["mask"].dtype == np.uint8 and out["mask"].tolist() == [[0, 1, 1, 4]]  # 0.3 / 0.5 → 1 (0.6 rounds up)


def test_scale_one_leaves_the_mul_out(tmp_path: Path) -> None:
    fp32 = image_model(tmp_path / "model.fp32.onnx", np.random.default_rng(1))
    u8 = uint8_input_onnx_from_onnx(fp32, tmp_path / "model.u8.onnx", scale=1.0)
    assert [n.op_type for n in onnx.load(str(u8)).graph.node[:2]] == ["Cast", "Transpose"]


def test_the_gate_fails_when_the_graph_and_the_recorded_scale_disagree(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    fp32 = image_model(tmp_path / "model.fp32.onnx", rng)
    u8 = uint8_input_onnx_from_onnx(fp32, tmp_path / "model.u8.onnx", scale=1 / 255)
    model = onnx.load(str(u8))
    next(p for p in model.metadata_props if p.key == SCALE_KEY).value = json.dumps({"image": 2 / 255})
    onnx.save(model, str(u8))
    images = rng.integers(0, 128, (16, 8, 8, 3)).astype(np.float32) / 255
    with pytest.raises(CheckFailed, match="fails its parity gate: output 'probs' differs by"):
        uint8_parity_from_models(fp32, u8, eval_data(images), tmp_path / "parity.json", atol=1e-5, rtol=1e-4)


def test_a_model_without_an_image_input_is_refused(tmp_path: Path) -> None:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    with pytest.raises(PipelineError, match="no float NHWC image input"):
        uint8_input_onnx_from_onnx(tmp_path / "m.onnx", tmp_path / "u8.onnx", scale=1 / 255)
