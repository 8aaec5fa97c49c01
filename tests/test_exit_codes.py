"""Exit status per command, for real in a subprocess: 0 success; 1 the work ran and a measured check
failed; 2 bad usage or bad input (one line, nothing written); 130 Ctrl-C.

Build's gate failure (1) is in tests/test_build_precision.py, verify's served drift (1) in
tests/triton/test_verify.py, loadtest's 0/1/2/130 in tests/loadtest/test_exit_codes.py, report's 2
in tests/test_report_html.py, config files' 2 in tests/test_config_file.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_USER_ERROR, CheckFailed, PipelineError
from tests.conftest import ROOT, Built, cli, interrupt_when_ready, one_line_error, popen_interruptible


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
def test_ctrl_c_during_a_build_exits_130_and_leaves_nothing_half_written(built: Built, tmp_path: Path) -> None:
    # A copy of the shared build (its stages stay cached); a new calibration method reruns only INT8,
    # which the pause-point hook (pipeline/pausepoints.py) holds after its second batch: no race.
    workdir, repo, marker = tmp_path / "build", tmp_path / "repo", tmp_path / "paused"
    shutil.copytree(built.workdir, workdir, symlinks=True)
    int8 = workdir / "digits" / "model.int8.onnx"
    before = int8.read_bytes()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               PIPELINE_PAUSE_AT="int8.calibration-batch#2", PIPELINE_PAUSE_FILE=str(marker))  # fmt: skip
    command = [sys.executable, "-m", "pipeline", "build", "--int8", "--calibration-method", "minmax",  # not the default: INT8 reruns
               "--workdir", str(workdir), "--repository", str(repo)]  # fmt: skip
    process = popen_interruptible(command, cwd=ROOT, env=env)
    interrupt_when_ready(process, marker.exists, "the second calibration batch")
    assert int8.read_bytes() == before  # the old INT8 model, not a half-calibrated one
    assert not list(int8.parent.glob(".model.int8.onnx.*"))  # no temporaries left behind
    assert not repo.exists() or not any(repo.iterdir())  # nothing published
