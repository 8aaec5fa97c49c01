"""The TensorRT check where TensorRT cannot run: TensorRT-RTX's real parser and builder (ahead of time, no GPU).

The stage tests build hand-made ONNX graphs through :func:`pipeline.stages.trt_check.trt_check_from_onnx`
for real (TensorRT-RTX, the ``trt-check`` extra: they skip without it on a developer's machine and fail
in CI). The build test converts a Keras model whose ONNX graph holds ``Unique``, which TensorRT's ONNX
parser refuses: the build goes on with its ONNX variant and records the parser's line, and with
``--require-tensorrt`` it stops with that line. The version-gated hand-written rules need no TensorRT.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from pipeline.backend.trt_support import summarize, version_gated
from pipeline.data.profiles import ShapeProfile
from pipeline.stages.engine import EngineSettings
from pipeline.stages.trt_check import problems_of, trt_check_from_onnx
from tests.conftest import cli, one_line_error
from tests.trt_standin import has_real_builder, real_builder

PROFILES = (ShapeProfile({"x": ((1, 4), (8, 4), (8, 4))}), ShapeProfile({"x": ((8, 4), (32, 4), (64, 4))}))
UNIQUE_LINE = "node 1 'uniq' (Unique): UNSUPPORTED_NODE in checkUnique: false"


def _graph(path: Path, *nodes: onnx.NodeProto, opset: int = 17, output: str = "u") -> Path:
    graph = helper.make_graph(list(nodes), "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def test_the_parser_s_refusal_names_the_node_the_op_and_its_words(tmp_path: Path) -> None:
    real_builder()
    good = _graph(tmp_path / "good.onnx", helper.make_node("Relu", ["x"], ["u"], name="relu"))
    bad = _graph(tmp_path / "bad.onnx", helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Unique", ["r"], ["u"], name="uniq"))
    engines = (EngineSettings("fp32", PROFILES, workspace_mib=64), EngineSettings("fp16", PROFILES))
    report = trt_check_from_onnx([good, bad], tmp_path / "check.json", engines=engines, compute_capability="8.9")
    assert report == json.loads((tmp_path / "check.json").read_text())
    assert report["checker"].startswith("TensorRT-RTX 1.") and report["compute_capability"] == "8.9"
    fp32, fp16 = report["variants"]["fp32"], report["variants"]["fp16"]
    assert (fp32["built"], fp32["errors"]) == (True, []) and fp32["layers"] >= 1 and fp32["plan_bytes"] > 0
    assert (fp16["built"], fp16["errors"]) == (False, [UNIQUE_LINE])
    assert problems_of(report) == {"fp32": [], "fp16": [UNIQUE_LINE]}


def test_profiles_that_do_not_fit_the_network_are_refused_by_the_check(tmp_path: Path) -> None:
    real_builder()
    good = _graph(tmp_path / "good.onnx", helper.make_node("Relu", ["x"], ["u"], name="relu"))
    wrong = (ShapeProfile({"x": ((1, 5), (8, 5), (8, 5))}),)
    report = trt_check_from_onnx([good], tmp_path / "check.json", engines=(EngineSettings("fp32", wrong),), compute_capability="8.0")
    [line] = report["variants"]["fp32"]["errors"]
    assert line == "TensorRT cannot use the shape range x:1x5/8x5/8x5 for input 'x' of shape [-1, 4]"


def test_version_gated_rules_are_the_ones_a_newer_parser_takes(tmp_path: Path) -> None:
    """RMSNormalization (onnx-tensorrt CHANGELOG: parsed from 10.15) and opset 23 (10.8: opsets 9..22) are refused by
    TensorRT 10.8 but not by the newest listed release; Unique, refused by every release, is not version-gated."""
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [4], [1.0] * 4)
    graph = helper.make_graph([helper.make_node("RMSNormalization", ["x", "scale"], ["n"], name="rms"),
                               helper.make_node("Unique", ["n"], ["u"], name="uniq")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("u", TensorProto.FLOAT, None)], [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    assert summarize(version_gated(model)) == ["opset: opset 23 is outside TensorRT 10.8's 9..22 (1 node, e.g. '(model)')",
                                               "RMSNormalization: parsed from TensorRT 10.15 on, not by 10.8 (1 node, e.g. 'rms')"]
    assert version_gated(model, "10.15") == []


@pytest.mark.slow
def test_a_graph_tensorrt_refuses_is_recorded_and_fatal_only_when_asked(tmp_path: Path) -> None:
    args = ("build", "--model", "tests.keras_models:unparsable_op", "--name", "uniq", "--calibration-root", str(tmp_path / "data"))
    proc = cli(*args, "--workdir", str(tmp_path / "build"), "--repository", str(tmp_path / "repo"), "--check-compute-capability", "8.6")
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "build" / "uniq" / "manifest.json").read_text())
    [line] = manifest["results"]["tensorrt_parser"]["fp32"]
    if has_real_builder():  # the node's index and name, its op, and the parser's words
        assert line.startswith("node ") and "/unique_sum_1/Unique' (Unique)" in line and line.endswith("(Unique): UNSUPPORTED_NODE in checkUnique: false")
        assert manifest["results"]["tensorrt_check"]["compute_capability"] == "8.6"
        assert {s["name"]: s["status"] for s in manifest["stages"]}["trt-check"] == "ran"
        assert f"WARNING: TensorRT-RTX could not build the fp32 graph: {line}" in proc.stderr
        assert "TensorRT build check" in proc.stdout and "TensorRT-RTX 1." in proc.stdout and "refused" in proc.stdout  # the terminal report's table
    else:
        assert line.startswith("Unique: not supported")
    assert (tmp_path / "repo" / "uniq_fp32" / "config.pbtxt").is_file()  # served by ONNX Runtime all the same

    failed = one_line_error(cli(*args, "--workdir", str(tmp_path / "build2"), "--repository", str(tmp_path / "repo2"), "--require-tensorrt"))
    assert failed.startswith("error: the fp32 graph does not build with TensorRT (") and f"): {line} — change the model" in failed
    assert not (tmp_path / "repo2").exists()

    inspected = cli("inspect", str(tmp_path / "build" / "uniq" / "model.fp32.onnx"))
    assert inspected.returncode == 1 and "Unique" in inspected.stdout
    if has_real_builder():
        assert f"  {line}" in inspected.stdout.splitlines()


def test_without_tensorrt_rtx_the_hand_written_rules_decide_and_refusal_is_one_line(tmp_path: Path) -> None:
    from pipeline.core.errors import PipelineError
    from pipeline.stages.trt_check import parser_problems, refusal

    bad = _graph(tmp_path / "bad.onnx", helper.make_node("Unique", ["x"], ["u"], name="uniq"))
    good = _graph(tmp_path / "good.onnx", helper.make_node("Relu", ["x"], ["u"], name="relu"))
    problems, checker = parser_problems(None, {"fp32": good, "fp16": bad})
    assert checker == "hand-written rules for TensorRT 10.8 (pipeline/backend/trt_support.py)"
    assert problems == {"fp32": [], "fp16": ["Unique: not supported by TensorRT's ONNX parser (not supported by the ONNX parser) (1 node, e.g. 'uniq')"]}
    refusal({"fp32": []}, checker)  # nothing refused: nothing raised
    with pytest.raises(PipelineError, match="^the fp16 graph does not build with TensorRT \\(hand-written rules .*\\): Unique: not supported"):
        refusal(problems, checker)
    report = {"checker": "TensorRT-RTX 1.7.1.116", "compute_capability": "8.0", "variants": {"fp32": {"errors": []}, "fp16": {"errors": [UNIQUE_LINE]}}}
    assert parser_problems(report, {"fp32": good, "fp16": bad}) == ({"fp32": [], "fp16": [UNIQUE_LINE]}, "TensorRT-RTX 1.7.1.116 (compute capability 8.0)")


def test_the_report_table_shows_layers_or_each_problem() -> None:
    from pipeline.reports.build_tables import tensorrt_data

    report = {"checker": "TensorRT-RTX 1.7.1.116", "compute_capability": "8.0",
              "variants": {"fp32": {"built": True, "layers": 26, "seconds": 0.26, "errors": []},
                           "fp16": {"built": False, "seconds": 0.01, "errors": [UNIQUE_LINE, "second"]}}}
    table = tensorrt_data({"tensorrt_check": report, "tensorrt_parser": {"fp32": [], "fp16": [UNIQUE_LINE, "second"]}})
    assert table is not None and table.rows == [
        ["fp32", "TensorRT-RTX 1.7.1.116 for 8.0", "built", "26", "0.26", ""],
        ["fp16", "TensorRT-RTX 1.7.1.116 for 8.0", "refused", "", "0.01", UNIQUE_LINE],
        ["", "", "", "", "", "second"],
    ] and table.styles == ["", "bad", "bad"]
    fallback = tensorrt_data({"tensorrt_parser": {"fp32": []}})
    assert fallback is not None and fallback.rows == [["fp32", "hand-written rules (no TensorRT-RTX)", "parses", "", "", ""]]
    assert tensorrt_data({}) is None  # TensorRT built the plans: no check
