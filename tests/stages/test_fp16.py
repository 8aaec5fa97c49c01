"""FP16 stage: real conversion, checked with onnx.checker and run in ONNX Runtime."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from pipeline.backend.onnxrt import session_from_onnx
from pipeline.core.errors import PipelineError
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


def test_keep_op_types_and_nodes_are_honoured(tmp_path: Path, onnx_file: Any) -> None:
    src = _token_model(onnx_file, tmp_path / "tokens.onnx", named=True)
    out = fp16_onnx_from_onnx(src, tmp_path / "fp16.onnx", keep_op_types=("MatMul",))
    model = onnx.load(str(out))
    weights = {i.name: i.data_type for i in model.graph.initializer}
    assert weights["w"] == TensorProto.FLOAT  # MatMul weight left in FP32
    assert weights["table"] == TensorProto.FLOAT16
    assert _elem_types(model)[next(n for n in model.graph.node if n.op_type == "MatMul").input[0]] == TensorProto.FLOAT

    by_name = fp16_onnx_from_onnx(src, tmp_path / "by_name.onnx", keep_nodes=("n0",))  # the Gather
    weights = {i.name: i.data_type for i in onnx.load(str(by_name)).graph.initializer}
    assert weights["table"] == TensorProto.FLOAT and weights["w"] == TensorProto.FLOAT16


def test_user_errors(tmp_path: Path, digits_convnet: Any) -> None:
    with pytest.raises(PipelineError, match="does not exist"):
        fp16_onnx_from_onnx(tmp_path / "missing.onnx", tmp_path / "out.onnx")
    once = fp16_onnx_from_onnx(digits_convnet.model, tmp_path / "once.onnx")
    with pytest.raises(PipelineError, match="cannot convert .* to FP16: The model is already converted"):
        fp16_onnx_from_onnx(once, tmp_path / "twice.onnx")
    assert not (tmp_path / "twice.onnx").exists()
    with pytest.raises(PipelineError, match=r"--fp16-keep-nodes names node\(s\) 'nope', 'con' \(did you mean 'conv'\?\) that .* does not have — pass node names .* to --fp16-keep-nodes"):
        fp16_onnx_from_onnx(digits_convnet.model, tmp_path / "out.onnx", keep_nodes=("nope", "con"))
    with pytest.raises(PipelineError, match=r"--fp16-keep-op-types names unknown ONNX op type\(s\) 'Softmx' \(did you mean Softmax\?\)"):
        fp16_onnx_from_onnx(digits_convnet.model, tmp_path / "out.onnx", keep_op_types=("Softmx",))
    assert not list(tmp_path.glob("*out.onnx*"))


# ----------------------------------------------------------------------------- control flow


def _scan_model(save_model: Any, path: Path, *, blocked_inside: bool) -> Path:
    """A Scan (an RNN over the time axis of ``x``) whose body reads an outer weight ``W`` and an
    outer activation ``bias_act``. With ``blocked_inside`` the body holds Softmax and Exp (kept-FP32
    ops), which the converter cannot handle inside a subgraph."""
    rng = np.random.default_rng(0)
    inner = [helper.make_node("Softmax", ["c2"], ["s_out"], axis=-1), helper.make_node("Exp", ["s_out"], ["y_t"])] if blocked_inside else [
        helper.make_node("Tanh", ["c2"], ["s_out"]),
        helper.make_node("Identity", ["s_out"], ["y_t"]),
    ]
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["s_in", "W"], ["a"]),
            helper.make_node("MatMul", ["x_t", "U"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["c"]),
            helper.make_node("Add", ["c", "bias_act"], ["c2"]),
            *inner,
        ],
        "body",
        [vi("s_in", TensorProto.FLOAT, ["batch", 4]), vi("x_t", TensorProto.FLOAT, ["batch", 3])],
        [vi("s_out", TensorProto.FLOAT, ["batch", 4]), vi("y_t", TensorProto.FLOAT, ["batch", 4])],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["xr"], name="relu"),
        helper.make_node("ReduceMean", ["xr"], ["m"], axes=[1], keepdims=0, name="mean"),
        helper.make_node("MatMul", ["m", "V"], ["bias_act"], name="bias"),
        helper.make_node("MatMul", ["m", "V"], ["s0"], name="init_state"),
        helper.make_node("Scan", ["s0", "xr"], ["s_last", "ys"], body=body, num_scan_inputs=1, scan_input_axes=[1], scan_output_axes=[1], name="rnn"),
        helper.make_node("MatMul", ["s_last", "H"], ["logits"], name="head"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
    ]
    weights = {
        "W": (rng.standard_normal((4, 4)) * 0.5).astype(np.float32),
        "U": rng.standard_normal((3, 4)).astype(np.float32),
        "V": rng.standard_normal((3, 4)).astype(np.float32),
        "H": rng.standard_normal((4, 2)).astype(np.float32),
    }
    outputs = [vi("probs", TensorProto.FLOAT, ["batch", 2]), vi("ys", TensorProto.FLOAT, ["batch", "T", 4])]
    return save_model(path, nodes, [vi("x", TensorProto.FLOAT, ["batch", "T", 3])], outputs, weights)


def _if_model(save_model: Any, path: Path) -> Path:
    """An If whose branches read outer tensors; the else branch holds Max (an op the converter keeps FP32)."""
    rng = np.random.default_rng(1)
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "A"], ["t0"]), helper.make_node("Softmax", ["t0"], ["t"])], "then", [], [vi("t", TensorProto.FLOAT, ["batch", 2])]
    )
    else_branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "B"], ["e0"]), helper.make_node("Max", ["e0", "xr"], ["e"])], "else", [], [vi("e", TensorProto.FLOAT, ["batch", 2])]
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["xr"], name="relu"),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="total"),
        helper.make_node("Greater", ["total", "zero"], ["cond"], name="positive"),
        helper.make_node("If", ["cond"], ["probs"], then_branch=then_branch, else_branch=else_branch, name="branch"),
    ]
    inits = {"A": rng.standard_normal((2, 2)).astype(np.float32), "B": rng.standard_normal((2, 2)).astype(np.float32), "zero": np.array(0, np.float32)}
    return save_model(path, nodes, [vi("x", TensorProto.FLOAT, ["batch", 2])], [vi("probs", TensorProto.FLOAT, ["batch", 2])], inits)


def _valid_and_close(src: Path, out: Path, feeds: list[dict[str, np.ndarray]], atol: float) -> None:
    onnx.checker.check_model(str(out), full_check=True)
    for feed in feeds:
        for a, b in zip(session_from_onnx(src).run(None, feed), session_from_onnx(out).run(None, feed), strict=True):
            assert b.dtype == np.float32
            np.testing.assert_allclose(b, a, atol=atol)


def test_scan_body_is_converted_to_fp16(tmp_path: Path, onnx_file: Any, caplog: pytest.LogCaptureFixture) -> None:
    src = _scan_model(onnx_file, tmp_path / "scan.onnx", blocked_inside=False)
    out = fp16_onnx_from_onnx(src, tmp_path / "scan16.onnx")
    model = onnx.load(str(out))
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    body = scan.attribute[0].g
    assert [i.type.tensor_type.elem_type for i in body.input] == [TensorProto.FLOAT16] * 2
    assert {i.name: i.data_type for i in model.graph.initializer}["W"] == TensorProto.FLOAT16
    assert "kept Scan" not in caplog.text
    rng = np.random.default_rng(2)
    _valid_and_close(src, out, [{"x": rng.standard_normal((5, t, 3)).astype(np.float32)} for t in (4, 9)], atol=5e-3)


def test_control_flow_the_converter_breaks_stays_fp32_as_an_island(tmp_path: Path, onnx_file: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pipeline.stages.fp16")
    src = _scan_model(onnx_file, tmp_path / "scan.onnx", blocked_inside=True)
    out = fp16_onnx_from_onnx(src, tmp_path / "scan16.onnx")
    kept = [r.getMessage() for r in caplog.records if "kept Scan 'rnn' in FP32" in r.getMessage()]
    assert len(kept) == 1 and "gave an invalid model" in kept[0] and "Exp" in kept[0]
    model = onnx.load(str(out))
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    body = scan.attribute[0].g
    assert [i.type.tensor_type.elem_type for i in body.input] == [TensorProto.FLOAT] * 2  # the body is untouched FP32
    inits = {i.name: i.data_type for i in model.graph.initializer}
    body_reads = {i for n in body.node for i in n.input}
    assert inits["W__fp32"] == TensorProto.FLOAT and "W__fp32" in body_reads and "W" not in inits  # the original weight, not a round trip
    assert "bias_act__fp32" in body_reads  # the FP16 outer activation reaches the body through a Cast
    producers = {o: n for n in model.graph.node for o in n.output}
    assert producers["bias_act__fp32"].op_type == "Cast" and inits["V"] == TensorProto.FLOAT16  # the rest is FP16
    rng = np.random.default_rng(3)
    _valid_and_close(src, out, [{"x": rng.standard_normal((5, t, 3)).astype(np.float32)} for t in (4, 9)], atol=5e-3)

    caplog.clear()
    src_if = _if_model(onnx_file, tmp_path / "if.onnx")
    out_if = fp16_onnx_from_onnx(src_if, tmp_path / "if16.onnx")
    assert "kept If 'branch' in FP32" in caplog.text
    _valid_and_close(src_if, out_if, [{"x": s * np.abs(rng.standard_normal((6, 2))).astype(np.float32)} for s in (1, -1)], atol=5e-3)


def test_keep_nodes_makes_a_control_flow_island(tmp_path: Path, onnx_file: Any) -> None:
    src = _scan_model(onnx_file, tmp_path / "scan.onnx", blocked_inside=False)
    out = fp16_onnx_from_onnx(src, tmp_path / "scan16.onnx", keep_nodes=("rnn",))
    body = next(n for n in onnx.load(str(out)).graph.node if n.op_type == "Scan").attribute[0].g
    assert [i.type.tensor_type.elem_type for i in body.input] == [TensorProto.FLOAT] * 2
    rng = np.random.default_rng(4)
    _valid_and_close(src, out, [{"x": rng.standard_normal((3, 6, 3)).astype(np.float32)}], atol=5e-3)


def _keras_rnn_onnx(tmp_path: Path, layer: str) -> Path:
    """A Keras GRU/LSTM over a dynamic time axis (GRU → ONNX Loop, LSTM → ONNX LSTM), exported for real."""
    import keras

    from pipeline.stages.onnx_export import onnx_from_savedmodel
    from pipeline.stages.savedmodel import savedmodel_from_keras

    keras.utils.set_random_seed(0)
    frames = keras.Input((None, 6), name="frames")
    hidden = getattr(keras.layers, layer)(16, return_sequences=True)(frames)
    hidden = getattr(keras.layers, layer)(12)(hidden)
    probs = keras.layers.Dense(4, activation="softmax", name="probs")(hidden)
    saved = savedmodel_from_keras(keras.Model(frames, probs), tmp_path / f"{layer}_saved")
    return onnx_from_savedmodel(saved, tmp_path / f"{layer}.onnx", 17)


@pytest.mark.slow
@pytest.mark.parametrize("layer", ["GRU", "LSTM"])
def test_keras_recurrent_models_convert_to_valid_fp16_within_the_gate(tmp_path: Path, layer: str) -> None:
    src = _keras_rnn_onnx(tmp_path, layer)
    ops = {n.op_type for n in onnx.load(str(src)).graph.node}
    assert ("Loop" if layer == "GRU" else "LSTM") in ops
    out = fp16_onnx_from_onnx(src, tmp_path / f"{layer}16.onnx")
    onnx.checker.check_model(str(out), full_check=True)
    rng = np.random.default_rng(5)
    for length in (7, 20):  # two sequence lengths through the dynamic axis
        x = rng.standard_normal((64, length, 6)).astype(np.float32)
        fp32 = session_from_onnx(src).run(None, {"frames": x})[0]
        fp16 = session_from_onnx(out).run(None, {"frames": x})[0]
        assert 0 < np.abs(fp16 - fp32).max() < 1e-2  # the FP16 gate's atol; really converted
        assert (fp16.argmax(1) == fp32.argmax(1)).mean() >= 0.98


@pytest.mark.slow
def test_cli_keep_flags(tmp_path: Path) -> None:
    """`build --fp16-keep-nodes` with a node the model lacks is one line naming it and the flag,
    nothing published; `--fp16-keep-op-types Conv` keeps the Conv weights FP32."""
    from tests.conftest import cli, one_line_error

    args = ["build", "--fp16", "--workdir", str(tmp_path / "build"), "--repository", str(tmp_path / "repo"), "--calibration-root", str(tmp_path / "data")]
    line = one_line_error(cli(*args, "--fp16-keep-nodes", "nope", cwd=tmp_path))
    assert "--fp16-keep-nodes names node(s) 'nope'" in line and "model.fp32.onnx" in line, line
    assert not (tmp_path / "repo").exists()
    proc = cli(*args, "--fp16-keep-op-types", "Conv", "--fp16-keep-op-types", "Softmax,Relu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = onnx.load(str(tmp_path / "build" / "digits" / "model.fp16.onnx"))
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    weights = {i.name: i.data_type for i in model.graph.initializer}
    assert weights[conv.input[1]] == TensorProto.FLOAT
    assert TensorProto.FLOAT16 in weights.values()  # the Dense layers are still FP16


def test_a_constant_shared_by_a_kept_op_and_an_fp16_op_is_valid(tmp_path: Path, onnx_file: Any) -> None:
    """tf2onnx deduplicates constants: exact GELU's 1 - Erf(x) and a Max(·, 1.0) (Max is on the
    converter's block list) read one initializer 1.0. The converter left it FP32 for both, and the
    FP16 Sub got an FP32 input: an invalid model (found on keras-hub DistilBERT)."""
    nodes = [
        helper.make_node("Erf", ["x"], ["e"], name="erf"),
        helper.make_node("Sub", ["one", "e"], ["erfc"], name="erfc"),
        helper.make_node("Max", ["x", "one"], ["m"], name="max"),
        helper.make_node("Add", ["erfc", "m"], ["y"], name="add"),
    ]
    src = onnx_file(tmp_path / "shared.onnx", nodes, [vi("x", TensorProto.FLOAT, ["batch", 4])], [vi("y", TensorProto.FLOAT, ["batch", 4])],
                    {"one": np.array(1.0, np.float32)})
    model = onnx.load(str(fp16_onnx_from_onnx(src, tmp_path / "fp16.onnx")))
    onnx.checker.check_model(model, full_check=True)
    inits = {i.name: i.data_type for i in model.graph.initializer}
    assert inits == {"one": TensorProto.FLOAT16, "one__fp32": TensorProto.FLOAT}
    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
    from math import erf

    want = 1 - np.vectorize(erf)(x) + np.maximum(x, 1.0)
    got = session_from_onnx(tmp_path / "fp16.onnx").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, atol=3e-3)


def test_integer_inputs_are_never_cast_to_float16(tmp_path: Path, onnx_file: Any) -> None:
    """Token ids cast to float (tf2onnx's negative-index check before a Gather, a mask made a
    multiplier) stay float32 casts, and the comparison reading them stays FP32: float16 holds
    integers exactly only up to 2048, and vocabularies go far beyond (id 30001 would become 30000)."""
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids_f"], name="ids_to_float", to=TensorProto.FLOAT),
        helper.make_node("Less", ["ids_f", "zero"], ["negative"], name="is_negative"),
        helper.make_node("Cast", ["negative"], ["neg_f"], name="neg_to_float", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["ids_f", "scale"], ["scaled"], name="scaled"),
        helper.make_node("Add", ["scaled", "neg_f"], ["y"], name="y"),
    ]
    src = onnx_file(tmp_path / "ids.onnx", nodes, [vi("ids", TensorProto.INT64, ["batch", 3])], [vi("y", TensorProto.FLOAT, ["batch", 3])],
                    {"zero": np.array(0.0, np.float32), "scale": np.array(1e-4, np.float32)})
    model = onnx.load(str(fp16_onnx_from_onnx(src, tmp_path / "fp16.onnx")))
    casts = {n.name: next(a.i for a in n.attribute if a.name == "to") for n in model.graph.node if n.op_type == "Cast"}
    assert casts["ids_to_float"] == casts["neg_to_float"] == TensorProto.FLOAT
    types = _elem_types(model)
    less = next(n for n in model.graph.node if n.name == "is_negative")
    assert types[less.input[0]] == TensorProto.FLOAT
    ids = np.array([[30001, 2047, 2049]], np.int64)
    got = session_from_onnx(tmp_path / "fp16.onnx").run(None, {"ids": ids})[0]
    np.testing.assert_allclose(got, ids * 1e-4, rtol=2e-3)  # the scaled ids in float16 (the Mul is FP16), from exact float32 ids
