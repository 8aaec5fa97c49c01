"""`python -m pipeline verify`: the labeled evaluation set through the real tritonserver, per served variant.

Uses the default-model build shared with tests/triton/test_build_to_triton.py (built once per session).
Nothing is mocked: real build, real tritonserver, real ONNX Runtime, the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format

from pipeline.triton.config import parse_config
from tests.conftest import Built, cli, one_line_error

pytestmark = pytest.mark.slow

EVAL_SAMPLES = 449  # calibration/digits/eval.npz


def test_served_accuracy_equals_in_process_for_every_variant(built: Built, tmp_path: Path) -> None:
    report_path = tmp_path / "v.json"
    proc = cli("verify", "--repository", str(built.repository), "--report", str(report_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    rows = {row["model"]: row for row in report["models"]}
    assert sorted(rows) == ["digits_fp16", "digits_fp32", "digits_int8", "digits_int8cpu"]
    for row in rows.values():
        assert row["passed"] and not row["failures"], row
        assert row["samples"] == EVAL_SAMPLES and row["version"] == 1
        probs = row["outputs"]["probs"]
        assert probs["kind"] == "classes" and probs["served_metric"] == probs["inprocess_metric"], row
        assert probs["agreement"] == 1.0 and probs["max_abs_diff"] <= 1e-5 and probs["nonfinite"] == 0, row
    fp32, int8 = rows["digits_fp32"]["outputs"]["probs"]["served_metric"], rows["digits_int8"]["outputs"]["probs"]["served_metric"]
    assert fp32 >= 0.95
    assert (fp32 - int8) * 100 <= 1.0, (fp32, int8)
    assert rows["digits_int8"]["precision"] == "int8" and rows["digits_fp16"]["precision"] == "fp16"


def test_a_server_fusing_qdq_into_integer_kernels_is_caught(built: Built, tmp_path: Path) -> None:
    """INT8 served at graph level 1 (Triton's onnxruntime backend: ORT_ENABLE_EXTENDED) must fail the check.

    EXTENDED fuses the Q/DQ pairs into integer kernels and quantizes the float biases, so the served
    probabilities no longer follow the Q/DQ graph TensorRT computes: on the digits INT8 model they
    move by 0.046 from the exact (ORT_DISABLE_ALL) numbers on this machine, far above verify's 1e-3
    tolerance. Top-1 accuracy happens to stay equal, so only the output comparison can catch it.
    """
    repository = tmp_path / "model_repository"
    shutil.copytree(built.repository, repository, symlinks=True)
    config_path = repository / "digits_int8" / "config.pbtxt"
    cfg = parse_config(config_path.read_text())
    assert cfg.optimization.graph.level == 2
    cfg.optimization.graph.level = 1
    config_path.write_text(text_format.MessageToString(cfg))

    report_path = tmp_path / "v.json"
    proc = cli("verify", "--repository", str(repository), "--report", str(report_path))
    line = one_line_error(proc, status=1)  # the check ran and failed: 1, not a usage error
    assert "digits_int8: output 'probs' served differs from in-process" in line and "level 2" in line, line
    assert "digits_fp32:" not in line and "digits_fp16:" not in line, line
    rows = {row["model"]: row for row in json.loads(report_path.read_text())["models"]}
    assert not rows["digits_int8"]["passed"] and rows["digits_int8"]["outputs"]["probs"]["max_abs_diff"] > 1e-2
    assert rows["digits_fp32"]["passed"] and rows["digits_fp16"]["passed"]


def test_build_verify_served_runs_the_check_at_the_end(built: Built, tmp_path: Path) -> None:
    """`build --verify-served` starts the embedded server after publishing and records the served check."""
    workdir = tmp_path / "build"
    shutil.copytree(built.workdir, workdir)
    proc = cli("build", "--fp16", "--int8", "--verify-served", "--workdir", str(workdir), "--repository", str(tmp_path / "repo"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifest = json.loads((workdir / "digits" / "manifest.json").read_text())
    stages = {s["name"]: s for s in manifest["stages"]}
    assert stages["served"]["status"] == "ran" and stages["publish"]["status"] == "ran"
    served = json.loads((workdir / "digits" / "served.json").read_text())
    assert {m["model"] for m in served["models"]} == {"digits_fp32", "digits_fp16", "digits_int8", "digits_int8cpu"}
    assert all(m["passed"] and m["outputs"]["probs"]["served_metric"] == m["outputs"]["probs"]["inprocess_metric"] for m in served["models"])
    assert all({r["output"] for r in m["gates"]} == {"probs"} for m in served["models"] if m["model"] != "digits_fp32")  # judged against served FP32
    assert "served through Triton vs in process" in proc.stdout
