"""Exit status per command, for real in a subprocess: 0 success; 1 the work ran and a measured check
failed; 2 bad usage or bad input (one line, nothing written); 130 Ctrl-C.

Build's gate failure (1) is in tests/test_build_precision.py, loadtest's 0/1/2/130 in
tests/loadtest/test_exit_codes.py, report's 2 in tests/test_report_html.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.errors import EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_USER_ERROR, CheckFailed, PipelineError
from tests.conftest import Built, cli, one_line_error


def test_the_codes_and_which_error_carries_which() -> None:
    assert (EXIT_CHECK_FAILED, EXIT_USER_ERROR, EXIT_INTERRUPTED) == (1, 2, 130)
    assert CheckFailed("gate").exit_code == 1 and PipelineError("typo").exit_code == 2
    assert isinstance(CheckFailed("gate"), PipelineError)  # everything that catches user errors catches it too


@pytest.mark.parametrize("argv", [
    ("build", "--no-such-flag"),
    ("build", "--opset", "seven"),
    ("verify", "--batch-size", "0"),
    ("mig-plan", "--gpu", "Z100-1GB"),
    ("loadtest", "--concurrency", "0"),
    ("nonsense",),
])  # fmt: skip
def test_bad_usage_is_2_with_one_line(argv: tuple[str, ...], tmp_path: Path) -> None:
    proc = cli(*argv, cwd=tmp_path)
    assert one_line_error(proc, status=2)
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_verify_served_drift_is_1(built: Built, tmp_path: Path) -> None:
    # Served INT8 outputs really drift when ONNX Runtime may optimize the Q/DQ graph (fusing it into
    # integer kernels): the copy's INT8 config asks for graph level 1 instead of the published 2.
    repo = tmp_path / "repo"
    shutil.copytree(built.repository, repo, symlinks=True)
    config_path = repo / "digits_int8" / "config.pbtxt"
    config = text_format.Parse(config_path.read_text(), mc.ModelConfig())
    assert config.optimization.graph.level == 2
    config.optimization.graph.level = 1
    config_path.write_text(text_format.MessageToString(config))

    ok = cli("verify", "--repository", str(built.repository), "--model", "digits_int8", "--report", str(tmp_path / "ok.json"))
    assert ok.returncode == 0, ok.stderr[-2000:]
    drift = cli("verify", "--repository", str(repo), "--model", "digits_int8", "--report", str(tmp_path / "drift.json"))
    line = one_line_error(drift, status=1)
    assert "served accuracy check failed: digits_int8: served outputs differ from in-process" in line
    [row] = json.loads((tmp_path / "drift.json").read_text())["models"]
    assert row["passed"] is False and row["max_abs_diff"] > 1e-3
