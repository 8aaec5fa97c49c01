"""LoadGen's accuracy mode (``loadtest --scenario S --mode accuracy``) against the embedded tritonserver on the
bundled model's build: the answers LoadGen logged, judged by the served gates, give the verdicts ``verify`` gives
for the same variants, on a sound repository and on one whose INT8 variant the server computes wrongly. Real build,
real LoadGen, real tritonserver, both commands in subprocesses."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format

from pipeline.loadtest.loadgen.verdict import ACCURACY
from pipeline.triton.config import parse_config
from tests.conftest import Built, cli, one_line_error

pytestmark = pytest.mark.slow

EVAL_SAMPLES = 449  # calibration/digits/eval.npz


def _verdicts(report: Path) -> dict[str, Any]:
    """Per model, what decides it: passed, the failures and notes (their numbers left out: a figure may differ in the
    last digits where the server batched requests differently), each gate row's verdict, each output's task metric."""
    def words(lines: list[str]) -> list[str]:
        return [re.sub(r"\d[\d.e+-]*", "#", line) for line in lines]

    return {m["model"]: {"passed": m["passed"], "failures": words(m["failures"]), "notes": words(m["notes"]), "samples": m["samples"],
                         "gates": [(g["output"], g["metric"], g["verdict"]) for g in m["gates"]],
                         "metrics": {o: out["served_metric"] for o, out in m["outputs"].items()}}
            for m in json.loads(report.read_text())["models"]}


def _both(repository: Path, tmp_path: Path, scenario: list[str], *extra: str) -> tuple[Any, Any, Path]:
    common = ["--repository", str(repository), "--workdir", str(tmp_path / "w"), "--batch-size", "8", *extra]
    verify = cli("verify", *common, "--report", str(tmp_path / "verify.json"))
    loadgen = cli("loadtest", *common, *scenario, "--mode", "accuracy", "--report-dir", str(tmp_path / "r"))
    return verify, loadgen, tmp_path / "r"


def test_accuracy_mode_gives_verifys_verdicts_and_keeps_loadgens_logs(built: Built, tmp_path: Path) -> None:
    verify, loadgen, reports = _both(built.repository, tmp_path, ["--scenario", "offline"], "--accuracy-target", "99%")
    assert verify.returncode == 0 and loadgen.returncode == 0, loadgen.stderr[-3000:]
    judged = _verdicts(reports / "mlperf_accuracy.json")
    assert judged == _verdicts(tmp_path / "verify.json")
    assert sorted(judged) == ["digits_fp16", "digits_fp32", "digits_int8", "digits_int8cpu"]
    assert all(m["passed"] and m["samples"] == EVAL_SAMPLES for m in judged.values())
    # MLPerf's rule is stated beside the point-drop gate for every variant, not for FP32 itself
    assert [g for g in judged["digits_int8"]["gates"] if g[1].startswith("MLPerf target")] == [("probs", "MLPerf target (99.0% of FP32's)", "pass")]
    assert not [g for g in judged["digits_fp32"]["gates"] if g[1].startswith("MLPerf target")]
    runs = {r["model"]: r for r in json.loads((reports / "mlperf.json").read_text())["runs"]}
    assert {m: (r["mode"], r["scenario"], r["result"]) for m, r in runs.items()} == {m: ("accuracy", "Offline", "PASS") for m in judged}
    page = (reports / "index.html").read_text()  # the page beside the reports shows the run
    assert "MLPerf scenarios" in page and "MLPerf target (99.0% of FP32&#x27;s)" in page
    for model in judged:  # the four LoadGen logs, the accuracy log holding every sample's answer (449 samples: 57 batches of 8)
        logged = json.loads((reports / "mlperf" / model / ACCURACY).read_text())
        assert sorted({e["qsl_idx"] for e in logged}) == list(range(57)) and all(e["data"] for e in logged)


def test_a_variant_the_server_computes_wrongly_fails_both_alike(built: Built, tmp_path: Path) -> None:
    """INT8 served at graph level 1 fuses Q/DQ into integer kernels (tests/triton/test_verify.py): verify fails it,
    and so must the answers LoadGen logged, with the same failures; the run exits 1 and mlperf.json says FAIL."""
    repository = tmp_path / "model_repository"
    shutil.copytree(built.repository, repository, symlinks=True)
    config_path = repository / "digits_int8" / "config.pbtxt"
    cfg = parse_config(config_path.read_text())
    cfg.optimization.graph.level = 1
    config_path.write_text(text_format.MessageToString(cfg))

    verify, loadgen, reports = _both(repository, tmp_path, ["--scenario", "single-stream"])
    assert one_line_error(verify, status=1) and "digits_int8: output 'probs' served differs from in-process" in one_line_error(loadgen, status=1)
    judged = _verdicts(reports / "mlperf_accuracy.json")
    assert judged == _verdicts(tmp_path / "verify.json")
    assert not judged["digits_int8"]["passed"] and all(m["passed"] for name, m in judged.items() if name != "digits_int8")
    runs = {r["model"]: r for r in json.loads((reports / "mlperf.json").read_text())["runs"]}
    assert runs["digits_int8"]["result"] == "FAIL" and runs["digits_int8"]["scenario"] == "SingleStream"
    assert any("served differs from in-process" in why for why in runs["digits_int8"]["reasons"])


def test_accuracy_options_are_refused_in_one_line(tmp_path: Path) -> None:
    for flags, words in ((["--accuracy-target", "120%"], "accuracy target '120%' is not a share of FP32's metric"),
                         (["--accuracy-target", "ninety"], "accuracy target 'ninety' is not a share"),
                         (["--gate-confidence", "2"], "--gate-confidence 2 is out of range"),
                         (["--mode", "performance", "--target-qps", "9", "--accuracy-target", "99%"], "--accuracy-target judge an accuracy run; a performance run "
                                                                                  "would ignore them")):
        proc = cli("loadtest", "--repository", str(tmp_path / "none"), "--scenario", "offline", "--mode", "accuracy", *flags,
                   "--report-dir", str(tmp_path / "r"))
        line = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and words in line and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    proc = cli("loadtest", "--repository", str(tmp_path / "none"), "--mode", "accuracy", "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "--mode accuracy is a mode of an MLPerf scenario — add --scenario" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "r").exists()
