"""`inspect` and the TensorRT ONNX-parser check: hand-made ONNX graphs that break each encoded
restriction, the data file's provenance, the CLI on ONNX / Q/DQ / plan files.

TensorRT itself is not installed here: what is tested is our encoding of onnx-tensorrt's published
operator list, never the parser."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.backend.trt_support import check_onnx, op_counts, summarize, support_data, warn_unparsable
from pipeline.core.errors import PipelineError
from tests.conftest import cli, one_line_error

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset: int = 17, extra_opsets=()) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *extra_opsets])
    m.ir_version = 8
    return m


def vi(name: str, elem: int = F, shape=("batch", 4)) -> onnx.ValueInfoProto:  # type: ignore[no-untyped-def]
    return helper.make_tensor_value_info(name, elem, list(shape))


def problems(m: onnx.ModelProto, target: str = "10.5") -> list[str]:
    return [f"{f.op}: {f.problem}" for f in check_onnx(m, target)]


def test_a_plain_model_parses() -> None:
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    m = model([helper.make_node("MatMul", ["x", "w"], ["l"]), helper.make_node("Softmax", ["l"], ["y"])], [vi("x")], [vi("y", shape=("batch", 3))], [w])
    assert problems(m) == [] and problems(m, "10.15") == []
    assert op_counts(m) == {"MatMul": 1, "Softmax": 1}


def test_unsupported_unknown_and_custom_domain_ops() -> None:
    nodes = [
        helper.make_node("Unique", ["x"], ["u"]),
        helper.make_node("Gelu", ["x"], ["g"]),
        helper.make_node("FusedThing", ["x"], ["c"], domain="com.example"),
    ]
    m = model(nodes, [vi("x")], [vi("u"), vi("g"), vi("c")], extra_opsets=[helper.make_opsetid("com.example", 1)], opset=20)
    found = problems(m)
    assert "Unique: not supported by TensorRT's ONNX parser (not supported by the ONNX parser)" in found
    assert "com.example::FusedThing: custom-domain op: TensorRT 10.5 needs a plugin for it" in found
    assert not any(p.startswith("Gelu") for p in found)


def test_ops_added_after_the_target_version() -> None:
    m = model([helper.make_node("RMSNormalization", ["x", "s"], ["y"])], [vi("x"), vi("s", shape=(4,))], [vi("y")], opset=23)
    assert "RMSNormalization: parsed from TensorRT 10.15 on, not by 10.5" in problems(m)
    assert "opset: opset 23 is outside TensorRT 10.5's 9..20" in problems(m)
    assert problems(m, "10.15") == []


def test_restrictions_lifted_in_later_versions() -> None:
    squeeze = model([helper.make_node("Squeeze", ["x", "axes"], ["y"])], [vi("x", shape=("batch", 1)), vi("axes", TensorProto.INT64, shape=(1,))], [vi("y", shape=("batch",))])
    assert problems(squeeze) == ["Squeeze: `axes` must be a constant"]
    assert problems(squeeze, "10.15") == []  # dynamic axes since 10.7
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    constant = model([helper.make_node("Squeeze", ["x", "axes"], ["y"])], [vi("x", shape=("batch", 1))], [vi("y", shape=("batch",))], [axes])
    assert problems(constant) == []


@pytest.mark.parametrize("node, expected", [
    (helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=2, layout=1), "LSTM: `layout` must be 0"),
    (helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="cubic"), "Resize: supported modes: nearest, linear"),
    (helper.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2, 2]), "MaxPool: the `Indices` output is unsupported"),
    (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 2]), "MaxPool: `dilations` must be empty or all ones"),
    (helper.make_node("TopK", ["x", "k"], ["v", "i"], sorted=0), "TopK: `sorted` must be 1"),
    (helper.make_node("Einsum", ["x", "x"], ["y"], equation="...i,...i->..."), "Einsum: ellipsis, diagonal and broadcasting between inputs are unsupported"),
])
def test_attribute_restrictions(node: onnx.NodeProto, expected: str) -> None:
    assert expected in summarize_ops(node)


def summarize_ops(node: onnx.NodeProto) -> list[str]:
    inits = [numpy_helper.from_array(np.array([1.0, 1.0, 2.0, 2.0], np.float32), "scales"), numpy_helper.from_array(np.array([2], np.int64), "k")]
    m = model([node], [vi("x", shape=(1, 3, 8, 8)), vi("w", shape=(1, 8, 8)), vi("r", shape=(1, 8, 2))], [vi(o) for o in node.output if o], inits)
    return problems(m)


def test_types_and_quantization_rules() -> None:
    ints = model([helper.make_node("MatMul", ["a", "b"], ["y"])], [vi("a", TensorProto.INT32), vi("b", TensorProto.INT32, shape=(4, 4))], [vi("y", TensorProto.INT32)])
    assert problems(ints) == ["MatMul: INT32 is not among its types in TensorRT 10.5 (FP32, FP16, BF16)"]
    q = numpy_helper.from_array(np.array([0.1], np.float32), "s")
    zp = numpy_helper.from_array(np.array([3], np.int8), "zp")
    asym = model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"])], [vi("x")], [vi("y")], [q, zp])
    assert problems(asym) == ["QuantizeLinear: `y_zero_point` must be 0", "DequantizeLinear: `x_zero_point` must be zero"]


def test_subgraphs_are_checked() -> None:
    body = helper.make_graph([helper.make_node("Unique", ["x"], ["u"])], "then", [], [vi("u")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["v"])], "else", [], [vi("v")])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=other)], [vi("c", TensorProto.BOOL, shape=()), vi("x")], [vi("y")])
    assert any(p.startswith("Unique:") for p in problems(m))


def test_summary_groups_nodes_and_build_warning(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    m = model([helper.make_node("Unique", ["x"], ["a"], name="u1"), helper.make_node("Unique", ["a"], ["b"], name="u2")], [vi("x")], [vi("b")])
    assert summarize(check_onnx(m)) == ["Unique: not supported by TensorRT's ONNX parser (not supported by the ONNX parser) (2 nodes, e.g. 'u1')"]
    onnx.save(m, str(tmp_path / "m.onnx"))
    with caplog.at_level(logging.WARNING, logger="pipeline.backend.trt_support"):
        found = warn_unparsable({"fp16": tmp_path / "m.onnx"})
    assert found == {"fp16": summarize(check_onnx(m))}
    assert [r.getMessage() for r in caplog.records] == [f"TensorRT 10.8's ONNX parser would not take the fp16 model: {found['fp16'][0]}"]


def test_the_data_names_its_source_and_targets() -> None:
    data = support_data()
    assert "onnx/onnx-tensorrt docs/operators.md" in data["source"] and "CHANGELOG.md" in data["source"]
    assert data["targets"]["10.5"]["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3"
    assert all(target["note"] for target in data["targets"].values())  # each says where its values come from
    kinds = {c["kind"] for rule in data["ops"].values() for c in rule.get("checks", [])}
    assert kinds <= {"constant_input", "constant_below", "zero_input", "false_input", "attribute_equals", "attribute_in",
                     "all_ones_attribute", "attribute_absent", "max_outputs", "input_rank_in", "einsum_simple"}
    assert all(rule.get("supported") is False or rule["types"] for rule in data["ops"].values())
    with pytest.raises(PipelineError, match="no ONNX parser data for TensorRT 9.0"):
        check_onnx(model([], [vi("x")], [vi("x")]), "9.0")


# -- the four rules review doubted, each against onnx-tensorrt's docs/operators.md (pipeline/backend/trt_support.py) --------


def test_rule_opset_range_per_target() -> None:
    """The 10.15 list: 'supports operators in the inclusive range of opset 9 to opset 24'; 10.8: 9..22 (opset 22,
    ONNX 1.17, came in 10.6); 10.5 (the NGC 24.10 image): 9..20."""
    x, y = [vi("x")], [vi("y")]
    at = {opset: model([helper.make_node("Relu", ["x"], ["y"])], x, y, opset=opset) for opset in (8, 21, 22, 23, 24)}
    assert problems(at[22], "10.8") == [] and problems(at[21], "10.5") == ["opset: opset 21 is outside TensorRT 10.5's 9..20"]
    assert problems(at[23], "10.8") == ["opset: opset 23 is outside TensorRT 10.8's 9..22"]
    assert problems(at[24], "10.15") == [] and problems(at[8], "10.15") == ["opset: opset 8 is outside TensorRT 10.15's 9..24"]


def test_rule_the_default_target_is_what_build_needs() -> None:
    """Not 10.5 (what the NGC 24.10 image runs): the engine stage needs TensorRT 10.8 (pyproject's bound), so a
    build on a machine with TensorRT is checked against the parser it will use."""
    import re

    data = support_data()
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    [lower] = re.findall(r'"tensorrt>=([0-9.]+)', pyproject)
    assert data["default_target"] == data["build_minimum"] == lower == "10.8"
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x")], [vi("y")], opset=22)
    assert check_onnx(m) == [] and problems(m, "10.5") == ["opset: opset 22 is outside TensorRT 10.5's 9..20"]


def test_rule_topk_k_must_be_below_3840_when_constant_and_may_be_computed() -> None:
    """10.15: '`sorted` must be 1. `K` input must be less than 3840' — no initializer rule (8.4's list had
    '`K` input must be an initializer'), so a K computed in the graph parses and TensorRT checks it at build time."""
    def topk(k_value: int | None) -> onnx.ModelProto:
        nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"])]
        inputs = [vi("x", shape=("batch", 5000))]
        inits = []
        if k_value is None:  # K computed from the input's shape
            nodes[:0] = [helper.make_node("Shape", ["x"], ["s"], start=1), helper.make_node("Div", ["s", "two"], ["k"])]
            inits.append(numpy_helper.from_array(np.array([2], np.int64), "two"))
        else:
            inits.append(numpy_helper.from_array(np.array([k_value], np.int64), "k"))
        return model(nodes, inputs, [vi("v", shape=("batch", None)), vi("i", TensorProto.INT64, shape=("batch", None))], inits)

    assert problems(topk(None), "10.8") == [] and problems(topk(None), "10.5") == []
    assert problems(topk(5), "10.8") == []
    assert problems(topk(4000), "10.8") == ["TopK: `K` must be less than 3840"]


def test_rule_model_local_functions_are_expanded_not_sent_to_a_plugin() -> None:
    """10.15's list composes ops 'in the form of a model local function' (DynamicQuantizeLinear's row): the
    parser expands a call, so the body is checked — and an unsupported op inside it is still found."""
    def with_function(body_op: str) -> onnx.ModelProto:
        body = [helper.make_node(body_op, ["a"], ["b"])]
        fn = helper.make_function("local.fns", "Block", ["a"], ["b"], body, [helper.make_opsetid("", 17)])
        m = model([helper.make_node("Block", ["x"], ["y"], domain="local.fns")], [vi("x")], [vi("y")],
                  extra_opsets=[helper.make_opsetid("local.fns", 1)])
        m.functions.append(fn)
        return m

    assert problems(with_function("Relu"), "10.8") == []
    assert problems(with_function("Unique"), "10.8") == ["Unique: not supported by TensorRT's ONNX parser (not supported by the ONNX parser)"]
    plugin = model([helper.make_node("Block", ["x"], ["y"], domain="other.ops")], [vi("x")], [vi("y")], extra_opsets=[helper.make_opsetid("other.ops", 1)])
    assert problems(plugin, "10.8") == ["other.ops::Block: custom-domain op: TensorRT 10.8 needs a plugin for it"]


def qdq_conv(path: Path) -> Path:
    """x → Q/DQ → Conv(W via DQ, per-channel) → Relu; plus a float MatMul left unquantized."""
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.int8), "w_q")
    ws = numpy_helper.from_array(np.array([0.1, 0.2], np.float32), "w_s")
    wz = numpy_helper.from_array(np.zeros(2, np.int8), "w_z")
    xs = numpy_helper.from_array(np.array(0.05, np.float32), "x_s")
    xz = numpy_helper.from_array(np.array(0, np.int8), "x_z")
    m2 = numpy_helper.from_array(np.ones((6, 6), np.float32), "m")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv", kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MatMul", ["r", "m"], ["y"], name="head"),
    ]
    onnx.save(model(nodes, [vi("x", shape=("batch", 1, 8, 8))], [vi("y", shape=("batch", 2, 6, 6))], [w, ws, wz, xs, xz, m2]), str(path))
    return path


def test_cli_inspects_a_qdq_onnx_model(tmp_path: Path) -> None:
    proc = cli("inspect", str(qdq_conv(tmp_path / "q.onnx")), "--max-batch", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "x: float32 [batch, 1, 8, 8]  dynamic axes [0]" in out
    assert "0: x:1x1x8x8/8x1x8x8/8x1x8x8" in out
    assert "quantized (Q/DQ) nodes: Conv ×1" in out
    assert "Conv 'conv': input 0 (activation) per-tensor, input 1 (weight) per-channel (axis 0)" in out
    assert "left in float: MatMul 'head'" in out
    assert "TensorRT 10.8 ONNX parser: every node is supported" in out  # the default: what build needs
    assert "---- 6 Node(s) ----" in out  # Polygraphy's own summary
    as_json = json.loads(cli("inspect", str(tmp_path / "q.onnx"), "--json").stdout)
    assert as_json["op_counts"]["DequantizeLinear"] == 2 and as_json["parser"] == {"10.8": []}


def test_cli_exit_1_and_the_problems_when_the_parser_would_refuse(tmp_path: Path) -> None:
    onnx.save(model([helper.make_node("Unique", ["x"], ["u"])], [vi("x")], [vi("u")]), str(tmp_path / "u.onnx"))
    proc = cli("inspect", str(tmp_path / "u.onnx"), "--trt-version", "10.5", "--trt-version", "10.15")
    assert proc.returncode == 1
    assert "TensorRT 10.5 ONNX parser: 1 problem(s)" in proc.stdout and "TensorRT 10.15 ONNX parser: 1 problem(s)" in proc.stdout
    assert "no ONNX parser data for TensorRT 7.0" in one_line_error(cli("inspect", str(tmp_path / "u.onnx"), "--trt-version", "7.0"))


def test_cli_profiles_from_data_and_a_shape_that_does_not_cover_it(tmp_path: Path) -> None:
    nodes = [helper.make_node("ReduceMean", ["t"], ["y"], axes=[1], keepdims=0)]
    m = model(nodes, [vi("t", shape=("batch", "t_dim1"))], [vi("y", shape=("batch",))], opset=17)
    onnx.save(m, str(tmp_path / "seq.onnx"))
    np.savez(tmp_path / "eval.npz", t__16=np.zeros((30, 16), np.float32), t__20=np.zeros((10, 20), np.float32))
    proc = cli("inspect", str(tmp_path / "seq.onnx"), "--eval-data", str(tmp_path / "eval.npz"), "--max-batch", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "0: t:1x16/8x16/8x32" in proc.stdout
    line = one_line_error(cli("inspect", str(tmp_path / "seq.onnx"), "--eval-data", str(tmp_path / "eval.npz"), "--shape", "t:1x1/8x16/8x16"))
    assert "--shape does not cover the data" in line and "--shape t:1x16/64x16/64x32" in line


def test_cli_on_plans_without_tensorrt(tmp_path: Path) -> None:
    plan = tmp_path / "model.fp16.plan"
    plan.write_bytes(b"not readable here")
    line = one_line_error(cli("inspect", str(plan)))
    assert "cannot read TensorRT plan" in line and "no metadata JSON beside it" in line
    meta = {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 4]}], "outputs": [{"name": "y", "dtype": "float32", "shape": [-1, 3]}],
            "profiles": [{"x": {"min": [1, 4], "opt": [8, 4], "max": [8, 4]}}]}
    (tmp_path / "model.fp16.plan.json").write_text(json.dumps(meta))
    proc = cli("inspect", str(plan))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the plan itself cannot be read here" in proc.stdout and "x: float32 [-1, 4]" in proc.stdout
    assert "optimization profiles of this plan:\n  0: x:1x4/8x4/8x4\n" in proc.stdout  # the --shape form, not JSON
    meta |= {"tensorrt_version": "10.16.1.11", "gpu": {"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0"},
             "hardware_compatibility": "AMPERE_PLUS", "tf32": False}
    (tmp_path / "model.fp16.plan.json").write_text(json.dumps(meta))
    proc = cli("inspect", str(plan))
    assert ("note: built with TensorRT 10.16.1.11 on NVIDIA H200 (compute capability 9.0): loads on that TensorRT version and any "
            "GPU of compute capability 8.0 or newer (hardware-compatible); TF32 off") in proc.stdout
    (tmp_path / "model.fp16.plan.json").write_text("{not json")
    line = one_line_error(cli("inspect", str(plan)))
    assert "model.fp16.plan.json is not valid JSON" in line and "rebuild the plan" in line


@pytest.mark.slow
def test_cli_converts_a_keras_model_as_build_does(tmp_path: Path) -> None:
    np.savez(tmp_path / "calib.npz", tokens__12=np.ones((40, 12), np.int32), tokens__24=np.ones((60, 24), np.int32))
    proc = cli("inspect", "tests.keras_models:tokens", "--calibration", str(tmp_path / "calib.npz"), "--max-batch", "16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tests.keras_models:tokens (function)" in proc.stdout
    assert "tokens: int32 [batch, tokens_dim1]  dynamic axes [0, 1]" in proc.stdout
    assert "0: tokens:1x8/16x24/16x32" in proc.stdout
    assert "TensorRT 10.8 ONNX parser: every node is supported" in proc.stdout


@pytest.mark.slow
def test_cli_names_a_tensorflow_op_no_opset_converts(tmp_path: Path) -> None:
    line = one_line_error(cli("inspect", "tests.keras_models:unsupported_op"))
    assert line.startswith("error: tf2onnx cannot convert TensorFlow op(s) Igamma (no tf2onnx handler at any opset up to 18) to ONNX opset 17"), line
