"""``build --int8`` on models users bring (tests/user_models.py), each with its own calibration and labelled data:
every variant asked for is published; the CPU INT8, which nobody asked for, either passes its gate or is left
out in one line; an INT8 graph whose gate fails fully quantized gets the accuracy-aware fallback and passes with
the nodes it kept in float listed. Real TensorFlow, tf2onnx and ONNX Runtime; slow (a build each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, cli, one_line_error
from tests.haswell import QEMU, native_outputs, outputs_under_haswell
from tests.user_models import USER_MODELS, outlier_data, price_data, write_data

pytestmark = pytest.mark.slow


def _build(tmp_path: Path, name: str, source: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("build", "--model", source, "--name", name, "--workdir", str(tmp_path / "w"), "--repository", str(tmp_path / "repo"),
               "--calibration", str(tmp_path / name / "calib.npz"), "--eval-data", str(tmp_path / name / "eval.npz"), *extra)


def _saved_model(tmp_path: Path) -> str:
    """``model.export()`` in a child process (TensorFlow stays out of the test process)."""
    path = tmp_path / "exported"
    code = f"from tests.user_models import export_churn_classifier; export_churn_classifier({str(path)!r})"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3",
                                                                                                 "PATH": "/usr/bin:/bin"})
    return str(path)


@pytest.mark.parametrize("name", list(USER_MODELS))
def test_int8_build_publishes_what_was_asked(name: str, tmp_path: Path) -> None:
    source, generate, eval_samples = USER_MODELS[name]
    write_data(tmp_path / name, generate, eval_samples)
    proc = _build(tmp_path, name, source or _saved_model(tmp_path), "--int8")
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((tmp_path / "w" / name / "manifest.json").read_text())
    published = {p.name for p in (tmp_path / "repo").iterdir() if p.is_dir()}
    assert {f"{name}_fp32", f"{name}_int8"} <= published, published
    verdicts = {v["precision"]: v for v in manifest["results"]["accuracy"]["variants"]}
    assert verdicts["int8"]["passed"], verdicts["int8"]
    left_out = {x["variant"]: x for x in manifest["results"]["left_out"]}
    if verdicts["int8cpu"]["passed"]:
        assert f"{name}_int8cpu" in published and not left_out
    else:  # left out in one line, the build green
        assert f"{name}_int8cpu" not in published and set(left_out) == {"int8cpu"}
        lines = [line for line in proc.stderr.splitlines() if f"{name}_int8cpu left out" in line]
        assert len(lines) == 1 and "--int8-cpu asks for it" in lines[0], proc.stderr[-3000:]
    if f"{name}_int8cpu" in published and QEMU is not None:  # ONNX Runtime's real AVX2 kernels give what this CPU's do
        with np.load(tmp_path / name / "eval.npz") as arrays:
            feed = {key: arrays[key][:64] for key in arrays.files}
        model = tmp_path / "w" / name / "model.int8cpu.onnx"
        for emulated, native in zip(outputs_under_haswell(model, feed, tmp_path / "haswell"), native_outputs(model, feed), strict=True):
            np.testing.assert_allclose(emulated, native, rtol=0, atol=1e-6)
    for precision, record in manifest["results"]["int8_fallback"].items():
        assert record["passed"] or (precision == "int8cpu" and precision in left_out), record
        if record["needed"] and record["kept"]:  # the nodes kept in float are said where the user sees them
            assert f"{precision}: gate passes with {len(record['kept'])} of" in proc.stderr
            assert all(k["node"] in proc.stderr and k["cost"] > 0 for k in record["kept"])


def test_the_fallback_keeps_a_quantization_hostile_layer_float(tmp_path: Path) -> None:
    """The first layer reads a counter in the thousands beside unit-scale features: quantized, its input's 8-bit step
    (~40) rounds every other feature to 0. The fallback finds that layer, keeps it float, and the gate passes;
    with the fallback off the same build fails."""
    write_data(tmp_path / "outlier", outlier_data, 600)
    source = "tests.user_models:outlier_classifier"
    off = _build(tmp_path, "outlier", source, "--int8", "--no-int8-cpu", "--no-int8-fallback")
    line = one_line_error(off, status=1)
    assert "accuracy gate failed: int8-onnx: output 'probs' (classes): accuracy drop (top-1)" in line
    assert not (tmp_path / "repo" / "outlier_int8").exists()

    on = _build(tmp_path, "outlier", source, "--int8", "--no-int8-cpu")
    assert on.returncode == 0, on.stderr[-3000:]
    ws = tmp_path / "w" / "outlier"
    record = json.loads((ws / "int8.fallback.json").read_text())
    assert record["needed"] and record["passed"] and [k["node"].rsplit("/", 3)[1] for k in record["kept"]] == ["first_1"], record
    assert record["first"]["failures"] and record["tried"][-1]["passed"]
    assert "int8: gate passes with 1 of 3 quantized nodes kept in float: StatefulPartitionedCall/functional_1/first_1/" in on.stderr
    assert (tmp_path / "repo" / "outlier_int8").is_dir()
    again = _build(tmp_path, "outlier", source, "--int8", "--no-int8-cpu")  # the stage cache keys on data, settings and code
    stages = {s["name"]: s["status"] for s in json.loads((ws / "manifest.json").read_text())["stages"]}
    assert again.returncode == 0 and stages["int8"] == "skipped"
    fresh = cli("build", "--model", source, "--name", "outlier", "--workdir", str(tmp_path / "fresh"), "--repository", str(tmp_path / "repo2"),
                "--calibration", str(tmp_path / "outlier" / "calib.npz"), "--eval-data", str(tmp_path / "outlier" / "eval.npz"), "--int8", "--no-int8-cpu")
    assert fresh.returncode == 0, fresh.stderr[-2000:]  # the same data, settings and code choose the same nodes, from scratch
    assert json.loads((tmp_path / "fresh" / "outlier" / "int8.fallback.json").read_text()) == record


def test_a_cpu_int8_that_cannot_be_made_is_left_out_unless_asked_for(tmp_path: Path) -> None:
    write_data(tmp_path / "linear", price_data, 400)
    source = "tests.user_models:linear_regressor"
    unasked = _build(tmp_path, "linear", source, "--int8")
    assert unasked.returncode == 0, unasked.stderr[-3000:]
    lines = [line for line in unasked.stderr.splitlines() if "linear_int8cpu left out" in line]
    assert len(lines) == 1 and "finds nothing to quantize" in lines[0], unasked.stderr[-2000:]
    assert {p.name for p in (tmp_path / "repo").iterdir()} == {"linear_fp32", "linear_int8"}
    manifest = json.loads((tmp_path / "w" / "linear" / "manifest.json").read_text())
    assert [x["variant"] for x in manifest["results"]["left_out"]] == ["int8cpu"]
    asked = _build(tmp_path, "linear", source, "--int8", "--int8-cpu")
    assert "finds nothing to quantize" in one_line_error(asked)  # named: its failure is the build's


def test_a_two_node_model_whose_int8_cannot_pass_fails_its_gate_not_as_a_usage_error(tmp_path: Path) -> None:
    """The smallest model the fallback meets (two Dense layers), --int8 and no evaluation data: the gate judges 300
    held-out calibration samples, the fallback may keep one node of two in float (never both: that is no INT8), and
    the build ends as a gate failure (exit 1) naming the bounds, the set tried and the samples of each step."""
    from tests.user_models import _inputs, tabular_data

    (tmp_path / "td").mkdir()
    np.savez(tmp_path / "td" / "calib.npz", **_inputs(tabular_data(600, 1)))
    proc = cli("build", "--model", "tests.user_models:two_dense_classifier", "--name", "td", "--int8", "--calibration", str(tmp_path / "td" / "calib.npz"),
               "--workdir", str(tmp_path / "w"), "--repository", str(tmp_path / "repo"), "--calibration-root", str(tmp_path / "calibration"))
    line = one_line_error(proc, 1)
    assert line.startswith("error: accuracy gate ") and "output 'segment' (classes): top-1 disagreement" in line and "(95% bounds, 300 samples)" in line, line
    assert "no set of up to 1 of 2 quantized nodes kept in float passes the gate (sets of 1 tried)" in line, line
    assert "nodes ranked on 64 calibration samples, each set judged on 300 samples" in line and "nothing to quantize" not in line, line
    assert "," not in line.split("--int8-keep-nodes ")[1].split(";")[0], line  # the flag it suggests keeps one layer, not both
    record = json.loads((tmp_path / "w" / "td" / "int8.fallback.json").read_text())
    assert record["bound"] == 1 and record["candidates"] == 2 and [t["kept"] for t in record["tried"]] == [1]
    accuracy = json.loads((tmp_path / "w" / "td" / "accuracy.json").read_text())
    row = next(v for v in accuracy["variants"] if v["variant"] == "int8-onnx")
    assert row["fallback"] == record_line(record) and accuracy["samples"] == 300
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def record_line(record: dict) -> str:
    from pipeline.stages.int8_fallback import describe_fallback

    return describe_fallback(record)
