"""INT8 Q/DQ stage: real ORT quantization and inference on tiny real models."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.backend.onnxrt import session_from_onnx
from pipeline.core.errors import PipelineError
from pipeline.data.tensors import signature_from_onnx
from pipeline.stages.calibration import calibration_from_path
from pipeline.stages.int8 import (
    QUANTIZED_OP_TYPES,
    check_qdq_int8_symmetric,
    qdq_onnx_from_onnx,
)

vi = helper.make_tensor_value_info


def _quantized(digits: Any, tmp_path: Path, method: str = "minmax", **kwargs: object) -> Path:
    data = calibration_from_path(digits.calib, signature_from_onnx(digits.model))
    tmp_path.mkdir(parents=True, exist_ok=True)
    return qdq_onnx_from_onnx(digits.model, tmp_path / f"int8_{method}.onnx", data, method=method, **kwargs)


def _consts(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def test_qdq_graph_is_symmetric_int8_per_channel_on_layer_inputs(digits_convnet: Any, tmp_path: Path) -> None:
    out = _quantized(digits_convnet, tmp_path)
    check_qdq_int8_symmetric(out)
    model = onnx.load(str(out))
    consts = _consts(model)
    nodes = model.graph.node
    qdq = [n for n in nodes if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert len(qdq) == 6  # activation Q/DQ pair and weight DQ for each of Conv and Gemm
    for node in qdq:
        zero_point = consts[node.input[2]]
        assert zero_point.dtype == np.int8 and not zero_point.any(), node.name

    producers = {o: n for n in nodes for o in n.output}
    consumers = {i: n for n in nodes for i in n.input}
    # every DequantizeLinear feeds a Conv/Gemm/MatMul: nothing else is quantized
    for dq in (n for n in nodes if n.op_type == "DequantizeLinear"):
        assert consumers[dq.output[0]].op_type in QUANTIZED_OP_TYPES
    # weights per output channel; biases stay float initializers (TensorRT wants float bias)
    for layer, out_channels, axis in (("conv", 8, 0), ("head", 10, 1)):
        node = next(n for n in nodes if n.name == layer)
        weight_dq = producers[node.input[1]]
        assert weight_dq.op_type == "DequantizeLinear"
        assert consts[weight_dq.input[0]].dtype == np.int8  # int8 initializer, no float weight → Q in the graph
        assert helper.get_attribute_value(next(a for a in weight_dq.attribute if a.name == "axis")) == axis
        assert consts[weight_dq.input[1]].shape == (out_channels,)
        assert producers[node.input[0]].op_type == "DequantizeLinear"
        assert node.input[2] in consts and consts[node.input[2]].dtype == np.float32
    softmax = next(n for n in nodes if n.op_type == "Softmax")
    assert producers[softmax.input[0]].op_type == "Gemm"  # no Q/DQ on the Gemm output / Softmax
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert {o.domain for o in model.opset_import} == {""}


def _conv_stack(onnx_file: Any, path: Path) -> Path:
    """Two 3×3 convolutions (16→32→32 channels) and a Gemm head: 15k weights, so the file is mostly weights."""
    rng = np.random.default_rng(3)
    inits = {"w1": rng.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.1, "b1": rng.standard_normal(32).astype(np.float32),
             "w2": rng.standard_normal((32, 32, 3, 3)).astype(np.float32) * 0.1, "b2": rng.standard_normal(32).astype(np.float32),
             "wg": rng.standard_normal((32, 10)).astype(np.float32), "bg": rng.standard_normal(10).astype(np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "wg", "bg"], ["logits"], name="head"),
    ]
    return onnx_file(path, nodes, [vi("x", TensorProto.FLOAT, ["batch", 16, 12, 12])], [vi("logits", TensorProto.FLOAT, ["batch", 10])], inits)


def test_int8_weights_are_a_quarter_of_the_file_and_dequantize_to_the_rounded_float_weights(tmp_path: Path, onnx_file: Any) -> None:
    """Weights are int8 initializers: the file shrinks to under 0.3× FP32, and each dequantized weight is
    exactly what a float weight → QuantizeLinear → DequantizeLinear pair gives (round half to even; the
    symmetric scale max|w|/127 keeps every value in range), so exact-Q/DQ numbers are those of the former Q→DQ form."""
    src = _conv_stack(onnx_file, tmp_path / "convs.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(4).standard_normal((128, 16, 12, 12)).astype(np.float32))
    out = qdq_onnx_from_onnx(src, tmp_path / "int8.onnx", calibration_from_path(tmp_path / "calib.npz", signature_from_onnx(src)))
    check_qdq_int8_symmetric(out)
    assert out.stat().st_size <= 0.3 * src.stat().st_size, (out.stat().st_size, src.stat().st_size)

    model, floats = onnx.load(str(out)), _consts(onnx.load(str(src)))
    consts = _consts(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    assert not [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in consts]  # no weight is quantized in the graph
    for layer, weight, axis in (("conv1", "w1", 0), ("conv2", "w2", 0), ("head", "wg", 1)):
        node = next(n for n in model.graph.node if n.name == layer)
        dq = producers[node.input[1]]
        stored, scale = consts[dq.input[0]], consts[dq.input[1]]
        assert stored.dtype == np.int8 and helper.get_attribute_value(next(a for a in dq.attribute if a.name == "axis")) == axis
        shape = [1] * stored.ndim
        shape[axis] = -1
        scale = scale.reshape(shape)
        np.testing.assert_array_equal(stored.astype(np.float32) * scale, np.clip(np.round(floats[weight] / scale), -128, 127) * scale)
        assert node.input[2] in consts and consts[node.input[2]].dtype == np.float32  # float bias, as before

    x = np.random.default_rng(5).standard_normal((32, 16, 12, 12)).astype(np.float32)
    fp32 = session_from_onnx(src).run(None, {"x": x})[0]
    int8 = session_from_onnx(out, exact_qdq=True).run(None, {"x": x})[0]
    assert 0 < np.abs(int8 - fp32).max() < 0.05 * np.abs(fp32).max()


def test_qdq_accuracy_within_one_point_of_fp32(digits_convnet: Any, tmp_path: Path) -> None:
    out = _quantized(digits_convnet, tmp_path)
    probs = session_from_onnx(out, exact_qdq=True).run(None, {"image": digits_convnet.eval_images})[0]
    accuracy = float((probs.argmax(1) == digits_convnet.eval_labels).mean())
    assert digits_convnet.fp32_accuracy > 0.9
    assert accuracy >= digits_convnet.fp32_accuracy - 0.01
    fp32 = session_from_onnx(digits_convnet.model).run(None, {"image": digits_convnet.eval_images})[0]
    assert 0 < np.abs(probs - fp32).max() < 0.2  # quantized for real, but close


@pytest.mark.parametrize("method", [pytest.param("entropy", marks=pytest.mark.slow), "percentile"])
def test_histogram_methods_keep_accuracy(digits_convnet: Any, tmp_path: Path, method: str) -> None:
    out = _quantized(digits_convnet, tmp_path, method, percentile=99.99)
    check_qdq_int8_symmetric(out)
    probs = session_from_onnx(out, exact_qdq=True).run(None, {"image": digits_convnet.eval_images})[0]
    accuracy = float((probs.argmax(1) == digits_convnet.eval_labels).mean())
    assert accuracy >= digits_convnet.fp32_accuracy - 0.02


def test_percentile_clips_the_activation_range_below_minmax(digits_convnet: Any, tmp_path: Path) -> None:
    minmax = _consts(onnx.load(str(_quantized(digits_convnet, tmp_path))))
    clipped = _consts(onnx.load(str(_quantized(digits_convnet, tmp_path, "percentile", percentile=99.0))))
    assert clipped["features_scale"] < minmax["features_scale"]


def test_calibration_reads_one_batch_at_a_time(
    digits_convnet: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Histograms are merged per batch: ORT reports one collection per batch of 64 (256 samples)."""
    caplog.set_level(logging.DEBUG, logger="pipeline.stages.int8_calibrate")
    _quantized(digits_convnet, tmp_path, "percentile", batch_size=64)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("calibration batch" in m for m in messages) == 4
    assert sum("Collecting tensor data" in m for m in messages) == 4


def test_integer_and_several_inputs_quantize_only_the_matmuls(tmp_path: Path, onnx_file: Any) -> None:
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"]),
        helper.make_node("ReduceMean", ["emb"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "w1"], ["a"]),
        helper.make_node("MatMul", ["extra", "w2"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    inits = {
        "table": rng.standard_normal((50, 6)).astype(np.float32),
        "w1": rng.standard_normal((6, 3)).astype(np.float32),
        "w2": rng.standard_normal((4, 3)).astype(np.float32),
    }
    src = onnx_file(
        tmp_path / "two_inputs.onnx",
        nodes,
        [vi("ids", TensorProto.INT64, ["batch", 5]), vi("extra", TensorProto.FLOAT, ["batch", 4])],
        [vi("probs", TensorProto.FLOAT, ["batch", 3]), vi("logits", TensorProto.FLOAT, ["batch", 3])][:1],
        inits,
    )
    np.savez(tmp_path / "calib.npz", ids=rng.integers(0, 50, (120, 5)), extra=rng.standard_normal((120, 4)).astype(np.float32))
    data = calibration_from_path(tmp_path, signature_from_onnx(src))
    out = qdq_onnx_from_onnx(src, tmp_path / "int8.onnx", data)
    model = onnx.load(str(out))
    gather = next(n for n in model.graph.node if n.op_type == "Gather")
    assert list(gather.input) == ["table", "ids"]  # embedding lookup untouched
    matmul_inputs = [i for n in model.graph.node if n.op_type == "MatMul" for i in n.input]
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    assert all(producers[i] == "DequantizeLinear" for i in matmul_inputs)
    feed = {"ids": rng.integers(0, 50, (7, 5)), "extra": rng.standard_normal((7, 4)).astype(np.float32)}
    fp32 = session_from_onnx(src).run(None, feed)[0]
    int8 = session_from_onnx(out, exact_qdq=True).run(None, feed)[0]
    assert np.abs(int8 - fp32).max() < 0.05


def test_fixed_batch_model_calibrates_with_its_batch(tmp_path: Path, onnx_file: Any) -> None:
    rng = np.random.default_rng(0)
    src = onnx_file(
        tmp_path / "fixed.onnx",
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [vi("x", TensorProto.FLOAT, [4, 6])],
        [vi("y", TensorProto.FLOAT, [4, 2])],
        {"w": rng.standard_normal((6, 2)).astype(np.float32)},
    )
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((10, 6)).astype(np.float32))
    data = calibration_from_path(tmp_path / "calib.npz", signature_from_onnx(src), min_samples=10)
    out = qdq_onnx_from_onnx(src, tmp_path / "int8.onnx", data, batch_size=32)
    check_qdq_int8_symmetric(out)


def test_bad_arguments_are_user_errors(digits_convnet: Any, tmp_path: Path, onnx_file: Any) -> None:
    data = calibration_from_path(digits_convnet.calib, signature_from_onnx(digits_convnet.model))
    with pytest.raises(PipelineError, match="unknown calibration method 'kl'.*minmax, entropy, percentile"):
        qdq_onnx_from_onnx(digits_convnet.model, tmp_path / "x.onnx", data, method="kl")
    with pytest.raises(PipelineError, match="percentile must be in"):
        qdq_onnx_from_onnx(digits_convnet.model, tmp_path / "x.onnx", data, method="percentile", percentile=0)
    with pytest.raises(PipelineError, match="does not exist"):
        qdq_onnx_from_onnx(tmp_path / "missing.onnx", tmp_path / "x.onnx", data)
    other = onnx_file(
        tmp_path / "other.onnx",
        [helper.make_node("Relu", ["x"], ["y"])],
        [vi("x", TensorProto.FLOAT, ["batch", 3])],
        [vi("y", TensorProto.FLOAT, ["batch", 3])],
    )
    with pytest.raises(PipelineError, match="has no Conv/ConvTranspose/Gemm/MatMul layers, so an INT8 variant"):
        qdq_onnx_from_onnx(other, tmp_path / "x.onnx", data)
    matmul = onnx_file(
        tmp_path / "matmul.onnx",
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [vi("x", TensorProto.FLOAT, ["batch", 3])],
        [vi("y", TensorProto.FLOAT, ["batch", 2])],
        {"w": np.ones((3, 2), np.float32)},
    )
    with pytest.raises(PipelineError, match=r"calibration data has inputs \['image'\].*\['x'\]"):
        qdq_onnx_from_onnx(matmul, tmp_path / "x.onnx", data)
    assert not list(tmp_path.glob("x.onnx*")) and not list(tmp_path.glob(".x.onnx*"))


def _qdq_model(save_model: Any, path: Path, zero_point: np.ndarray | None) -> Path:
    inputs = ["x", "scale"] + (["zp"] if zero_point is not None else [])
    inits = {"scale": np.array(0.1, np.float32)}
    if zero_point is not None:
        inits["zp"] = zero_point
    return save_model(
        path,
        [helper.make_node("QuantizeLinear", inputs, ["q"]), helper.make_node("DequantizeLinear", ["q", *inputs[1:]], ["y"])],
        [vi("x", TensorProto.FLOAT, ["batch", 3])],
        [vi("y", TensorProto.FLOAT, ["batch", 3])],
        inits,
    )


def test_check_rejects_asymmetric_or_uint8_or_missing_qdq(tmp_path: Path, onnx_file: Any) -> None:
    check_qdq_int8_symmetric(_qdq_model(onnx_file, tmp_path / "ok.onnx", np.array(0, np.int8)))
    with pytest.raises(PipelineError, match="zero point is not 0"):
        check_qdq_int8_symmetric(_qdq_model(onnx_file, tmp_path / "asym.onnx", np.array(3, np.int8)))
    with pytest.raises(PipelineError, match="zero point is uint8, not int8"):
        check_qdq_int8_symmetric(_qdq_model(onnx_file, tmp_path / "u8.onnx", np.array(0, np.uint8)))
    with pytest.raises(PipelineError, match="no zero point, so it quantizes to uint8"):
        check_qdq_int8_symmetric(_qdq_model(onnx_file, tmp_path / "nozp.onnx", None))
    plain = onnx_file(
        tmp_path / "plain.onnx",
        [helper.make_node("Relu", ["x"], ["y"])],
        [vi("x", TensorProto.FLOAT, ["batch", 3])],
        [vi("y", TensorProto.FLOAT, ["batch", 3])],
    )
    with pytest.raises(PipelineError, match="has no QuantizeLinear/DequantizeLinear nodes"):
        check_qdq_int8_symmetric(plain)


# ----------------------------------------------------------------------------- Q/DQ placement for TensorRT


def _w(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.3).astype(np.float32)


def _placement_model(save_model: Any, path: Path) -> Path:
    """A ResNet-like block (identity residual and projection shortcut), MaxPool, ConvTranspose,
    AveragePool, a Concat of branches with different ranges, GlobalAveragePool, Gemm(transB=1), MatMul."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["stem"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("Relu", ["stem"], ["stem_r"], name="stem_relu"),
        helper.make_node("Conv", ["stem_r", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "stem_r"], ["res"], name="identity_add"),
        helper.make_node("Relu", ["res"], ["res_r"], name="relu2"),
        helper.make_node("Conv", ["res_r", "w4", "b4"], ["c4"], pads=[1, 1, 1, 1], name="conv4"),
        helper.make_node("Conv", ["res_r", "wp", "bp"], ["proj"], name="projection"),
        helper.make_node("Add", ["c4", "proj"], ["res2"], name="projection_add"),
        helper.make_node("Relu", ["res2"], ["res2_r"], name="relu3"),
        helper.make_node("MaxPool", ["res2_r"], ["mp"], kernel_shape=[2, 2], strides=[2, 2], name="maxpool"),
        helper.make_node("ConvTranspose", ["mp", "wt", "bt"], ["up"], strides=[2, 2], kernel_shape=[2, 2], name="deconv"),
        helper.make_node("AveragePool", ["up"], ["ap"], kernel_shape=[2, 2], strides=[2, 2], name="avgpool"),
        helper.make_node("Mul", ["ap", "ten"], ["ap10"], name="widen"),  # a branch with a 10x range
        helper.make_node("Concat", ["ap10", "mp"], ["cat"], axis=1, name="concat"),
        helper.make_node("Conv", ["cat", "w3", "b3"], ["c3"], name="conv3"),
        helper.make_node("GlobalAveragePool", ["c3"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "wg", "bg"], ["g"], transB=1, name="gemm_t"),
        helper.make_node("MatMul", ["g", "wm"], ["logits"], name="matmul"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
    ]
    inits = {
        "w0": _w(rng, 4, 3, 3, 3), "b0": _w(rng, 4), "w1": _w(rng, 4, 4, 3, 3), "b1": _w(rng, 4), "w2": _w(rng, 4, 4, 3, 3), "b2": _w(rng, 4),
        "w4": _w(rng, 5, 4, 3, 3), "b4": _w(rng, 5), "wp": _w(rng, 5, 4, 1, 1), "bp": _w(rng, 5),
        "wt": _w(rng, 5, 6, 2, 2), "bt": _w(rng, 6), "ten": np.array(10.0, np.float32),
        "w3": _w(rng, 7, 11, 1, 1), "b3": _w(rng, 7), "wg": _w(rng, 9, 7), "bg": _w(rng, 9), "wm": _w(rng, 9, 3),
    }  # fmt: skip
    return save_model(path, nodes, [vi("x", TensorProto.FLOAT, ["batch", 3, 8, 8])], [vi("probs", TensorProto.FLOAT, ["batch", 3])], inits)


@pytest.fixture(scope="module")
def placed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, onnx.ModelProto]:
    def save_model(path: Path, nodes: list, inputs: list, outputs: list, inits: dict[str, np.ndarray]) -> Path:
        graph = helper.make_graph(nodes, "block", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        onnx.save(model, str(path))
        return path

    folder = tmp_path_factory.mktemp("placement")  # module-scoped: the onnx_file fixture is per test
    src = _placement_model(save_model, folder / "block.onnx")
    np.savez(folder / "calib.npz", x=np.random.default_rng(1).standard_normal((128, 3, 8, 8)).astype(np.float32))
    out = qdq_onnx_from_onnx(src, folder / "int8.onnx", calibration_from_path(folder / "calib.npz", signature_from_onnx(src)))
    return src, out, onnx.load(str(out))


def _inputs_dq(model: onnx.ModelProto, node_name: str) -> list[onnx.NodeProto | None]:
    producers = {o: n for n in model.graph.node for o in n.output}
    node = next(n for n in model.graph.node if n.name == node_name)
    return [p if (p := producers.get(i)) is not None and p.op_type == "DequantizeLinear" else None for i in node.input]


def _scale(model: onnx.ModelProto, dq: onnx.NodeProto) -> np.ndarray:
    return _consts(model)[dq.input[1]]


def test_residual_adds_have_both_inputs_quantized_and_no_output_qdq(placed: tuple[Path, Path, onnx.ModelProto]) -> None:
    _, out, model = placed
    check_qdq_int8_symmetric(out)
    consumers = {i: n for n in model.graph.node for i in n.input}
    for add in ("identity_add", "projection_add"):
        dqs = _inputs_dq(model, add)
        assert all(dq is not None for dq in dqs), add  # Conv+Add fuse with int8 residual
        node = next(n for n in model.graph.node if n.name == add)
        assert consumers[node.output[0]].op_type == "Relu"  # the Add output is not quantized
        assert all(_scale(model, dq).ndim == 0 for dq in dqs)  # per-tensor activations
    bias_free = [n for n in model.graph.node if n.op_type == "Add"]
    assert len(bias_free) == 2  # no other Add was touched


def test_pooling_inputs_quantized_and_maxpool_left_to_tensorrt(placed: tuple[Path, Path, onnx.ModelProto]) -> None:
    _, _, model = placed
    assert _inputs_dq(model, "avgpool")[0] is not None
    assert _inputs_dq(model, "maxpool")[0] is None  # commutes with Q/DQ; TensorRT moves the next Q across it
    assert _inputs_dq(model, "gap")[0] is None  # the classifier's global average stays float (accuracy)


def test_concat_inputs_share_one_scale_with_its_output(placed: tuple[Path, Path, onnx.ModelProto]) -> None:
    _, _, model = placed
    dqs = _inputs_dq(model, "concat")
    assert all(dq is not None for dq in dqs)
    scales = {float(_scale(model, dq)) for dq in dqs}
    assert len(scales) == 1  # TensorRT propagates equal scales backward across the Concat
    conv3_input = _inputs_dq(model, "conv3")[0]
    assert float(_scale(model, conv3_input)) == scales.pop()
    deconv_input = _inputs_dq(model, "deconv")[0]  # mp feeds the deconv too: it keeps its own, finer scale
    assert float(_scale(model, deconv_input)) < float(_scale(model, dqs[0]))


def test_per_channel_weight_axes(placed: tuple[Path, Path, onnx.ModelProto]) -> None:
    """Output channels: Conv weights axis 0, ConvTranspose (C_in, C_out, kH, kW) axis 1,
    Gemm with transB=1 (N, K) axis 0, MatMul (K, N) axis 1; biases stay float."""
    _, _, model = placed
    consts = _consts(model)
    for name, axis, channels in (("conv1", 0, 4), ("projection", 0, 5), ("deconv", 1, 6), ("gemm_t", 0, 9), ("matmul", 1, 3)):
        node = next(n for n in model.graph.node if n.name == name or n.name.startswith(f"{name}/"))
        weight_dq = _inputs_dq(model, node.name)[1]
        assert weight_dq is not None, name
        assert helper.get_attribute_value(next(a for a in weight_dq.attribute if a.name == "axis")) == axis, name
        assert consts[weight_dq.input[1]].shape == (channels,), name
        if len(node.input) > 2:
            assert consts[node.input[2]].dtype == np.float32, name


def test_placed_graph_keeps_the_exact_qdq_gate(placed: tuple[Path, Path, onnx.ModelProto]) -> None:
    src, out, _ = placed
    x = np.random.default_rng(2).standard_normal((64, 3, 8, 8)).astype(np.float32)
    fp32 = session_from_onnx(src).run(None, {"x": x})[0]
    int8 = session_from_onnx(out, exact_qdq=True).run(None, {"x": x})[0]
    assert 0 < np.abs(int8 - fp32).max() < 0.05
    assert (int8.argmax(1) == fp32.argmax(1)).mean() >= 0.95


def test_minmax_result_does_not_depend_on_the_calibration_batch(digits_convnet: Any, tmp_path: Path) -> None:
    """Batches sized to the memory budget give the same INT8 model as the old fixed batch of 32."""
    budgeted = _consts(onnx.load(str(_quantized(digits_convnet, tmp_path / "a"))))
    fixed = _consts(onnx.load(str(_quantized(digits_convnet, tmp_path / "b", batch_size=7))))
    assert budgeted.keys() == fixed.keys()
    for name, value in budgeted.items():
        np.testing.assert_array_equal(value, fixed[name], err_msg=name)


def test_calibration_buckets_of_different_lengths(tmp_path: Path, onnx_file: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A dynamic sequence axis: calibration sees every length, in batches of one length each."""
    rng = np.random.default_rng(0)
    src = onnx_file(
        tmp_path / "seq.onnx",
        [
            helper.make_node("Gather", ["table", "ids"], ["emb"]),
            helper.make_node("MatMul", ["emb", "w1"], ["h"]),
            helper.make_node("Relu", ["h"], ["hr"]),
            helper.make_node("ReduceMean", ["hr"], ["pooled"], axes=[1], keepdims=0),
            helper.make_node("MatMul", ["pooled", "w2"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        ],
        [vi("ids", TensorProto.INT64, ["batch", "seq"])],
        [vi("probs", TensorProto.FLOAT, ["batch", 3])],
        {"table": rng.standard_normal((50, 6)).astype(np.float32), "w1": _w(rng, 6, 8), "w2": _w(rng, 8, 3)},
    )
    np.savez(tmp_path / "calib.npz", ids__len5=rng.integers(0, 50, (70, 5)), ids__len9=rng.integers(0, 50, (50, 9)))
    data = calibration_from_path(tmp_path / "calib.npz", signature_from_onnx(src))
    caplog.set_level(logging.DEBUG, logger="pipeline.stages.int8_calibrate")  # one debug line per calibration batch
    out = qdq_onnx_from_onnx(src, tmp_path / "int8.onnx", data, batch_size=32)
    assert sum("calibration batch" in r.getMessage() for r in caplog.records) == 3 + 2
    check_qdq_int8_symmetric(out)
    for length in (5, 9, 14):
        feed = {"ids": rng.integers(0, 50, (8, length))}
        fp32 = session_from_onnx(src).run(None, feed)[0]
        int8 = session_from_onnx(out, exact_qdq=True).run(None, feed)[0]
        assert np.abs(int8 - fp32).max() < 0.05


def test_keep_nodes_stay_float_and_their_residual_add_is_not_quantized(placed: tuple[Path, Path, onnx.ModelProto], tmp_path: Path) -> None:
    src, _, _ = placed
    calib = calibration_from_path(src.parent / "calib.npz", signature_from_onnx(src))
    out = qdq_onnx_from_onnx(src, tmp_path / "kept.onnx", calib, keep_nodes=["conv4,projection", "gemm_t"])
    check_qdq_int8_symmetric(out)
    model = onnx.load(str(out))
    for name in ("conv4", "projection", "gemm_t"):
        assert _inputs_dq(model, name) == [None] * 3, name  # no Q/DQ on data, weight or bias
    assert all(dq is not None for dq in _inputs_dq(model, "conv1")[:2])  # the others are still quantized
    assert _inputs_dq(model, "projection_add") == [None, None]  # both Convs float: no int8 residual to fuse
    assert all(dq is not None for dq in _inputs_dq(model, "identity_add"))


def test_keep_nodes_errors_name_the_fix(placed: tuple[Path, Path, onnx.ModelProto], tmp_path: Path) -> None:
    src, _, _ = placed
    calib = calibration_from_path(src.parent / "calib.npz", signature_from_onnx(src))
    with pytest.raises(PipelineError, match=r"--int8-keep-nodes names node 'conv44' \(did you mean 'conv4'\?\) that .* does not have"):
        qdq_onnx_from_onnx(src, tmp_path / "a.onnx", calib, keep_nodes=["conv44"])
    with pytest.raises(PipelineError, match=r"--int8-keep-nodes names 'relu1', a Relu: only Conv/ConvTranspose/Gemm/MatMul layers are quantized"):
        qdq_onnx_from_onnx(src, tmp_path / "b.onnx", calib, keep_nodes=["relu1"])
    assert not list(tmp_path.iterdir())  # nothing written


def test_layer_errors_find_the_layer_that_adds_the_error(placed: tuple[Path, Path, onnx.ModelProto], tmp_path: Path) -> None:
    from pipeline.stages.layer_errors import describe, layer_errors_from_models, worst_layers

    src, out, _ = placed
    feed = {"x": np.random.default_rng(5).standard_normal((16, 3, 8, 8)).astype(np.float32)}
    errors = layer_errors_from_models(src, out, feed)
    assert [e.node for e in errors] == ["stem", "conv1", "conv2", "conv4", "projection", "deconv", "conv3", "gemm_t", "matmul"]
    # the graph input is the same in both; each layer's jump includes quantizing its own input
    assert errors[0].input_error == 0 and all(0 < e.output_error < 0.5 for e in errors)  # real INT8 noise, not garbage
    # Spoil one layer's weight scale by 20x in a copy: that layer's jump must stand out.
    spoiled = onnx.load(str(out))
    producers = {o: n for n in spoiled.graph.node for o in n.output}
    conv2 = next(n for n in spoiled.graph.node if n.name == "conv2")
    scale = next(i for i in spoiled.graph.initializer if i.name == producers[conv2.input[1]].input[1])
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 20, scale.name))
    onnx.save(spoiled, str(tmp_path / "spoiled.onnx"))
    errors = layer_errors_from_models(src, tmp_path / "spoiled.onnx", feed)
    assert worst_layers(errors, 1)[0].node == "conv2"
    assert "keep them in float with --int8-keep-nodes conv2" in describe(errors)



def test_layer_errors_measure_every_input_when_the_prepared_graph_renames_tensors(tmp_path: Path) -> None:
    """A tf2onnx graph is NHWC with Transposes around each Conv; ONNX Runtime's pre-quantization pass
    cancels them and rewrites the ops between, so the INT8 graph's float tensors get new names. Every
    layer's input error must still be measured (it was 0.0, unmeasured, for 53 of MobileNetV3Small's
    54 layers, which made the ranking of layers wrong)."""
    from pipeline.stages.layer_errors import layer_errors_from_models

    rng = np.random.default_rng(3)
    to_nchw, to_nhwc = [0, 3, 1, 2], [0, 2, 3, 1]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t1:0"], name="t1", perm=to_nchw),
        helper.make_node("Conv", ["t1:0", "w1", "b1"], ["c1:0"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c1:0"], ["t2:0"], name="t2", perm=to_nhwc),
        helper.make_node("Relu", ["t2:0"], ["act:0"], name="act"),
        helper.make_node("Transpose", ["act:0"], ["t3:0"], name="t3", perm=to_nchw),
        helper.make_node("Conv", ["t3:0", "w2", "b2"], ["c2:0"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c2:0"], ["y"], name="t4", perm=to_nhwc),
    ]
    inits = {"w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "b1": np.zeros(8, np.float32),
             "w2": rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.2, "b2": np.zeros(4, np.float32)}
    graph = helper.make_graph(nodes, "nhwc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 8, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 8, 4])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src = tmp_path / "nhwc.onnx"
    onnx.save(model, str(src))
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((128, 8, 8, 3)).astype(np.float32))
    int8 = qdq_onnx_from_onnx(src, tmp_path / "int8.onnx", calibration_from_path(tmp_path / "calib.npz", signature_from_onnx(src)))
    produced = {o for n in onnx.load(str(int8)).graph.node for o in n.output}
    assert not {"act:0", "t3:0"} <= produced, "ONNX Runtime kept the tf2onnx names: this test would test nothing"
    feed = {"x": rng.standard_normal((16, 8, 8, 3)).astype(np.float32)}
    errors = layer_errors_from_models(src, int8, feed)
    assert [e.node for e in errors] == ["conv1", "conv2"]
    assert errors[0].input_error == 0 and errors[1].input_error > 0.5 * errors[0].output_error, errors  # conv2 sees conv1's error


def test_ort_pre_processing_writes_its_temporary_copy_beside_the_output_not_in_tmp(tmp_path: Path) -> None:
    """quant_pre_process writes a whole copy of the model into a tempfile folder: inside temporaries_in, that is the
    workspace's folder; Python's default comes back after."""
    import tempfile

    from pipeline.stages.int8_calibrate import temporaries_in

    before = tempfile.gettempdir()
    with temporaries_in(tmp_path):
        with tempfile.TemporaryDirectory(prefix="pre.quant.") as inner:
            assert Path(inner).parent == tmp_path
    assert tempfile.gettempdir() == before
