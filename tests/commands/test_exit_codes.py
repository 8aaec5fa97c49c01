"""Exit status per command, for real in a subprocess: 0 success; 1 the work ran and a measured check
failed; 2 bad usage or bad input (one line, nothing written); 130 Ctrl-C.

Build's gate failure (1) is in tests/build/test_build_precision.py, verify's served drift (1) in
tests/triton/test_verify.py, loadtest's 0/1/2/130 in tests/loadtest/test_exit_codes.py, report's 2
in tests/reports/test_report_html.py, config files' 2 in tests/commands/test_config_file.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_USER_ERROR, CheckFailed, PipelineError
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
    # which the pause-point hook (pipeline/core/pausepoints.py) holds after its second batch: no race.
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


@pytest.mark.parametrize("argv", [
    ("build", "--repository", "plain-file/repo"),
    ("build", "--workdir", "plain-file/build"),
    ("report", "--workdir", "work", "--output", "plain-file/sub/index.html"),
])  # fmt: skip
def test_a_path_that_cannot_be_created_is_one_line_naming_it(argv: tuple[str, ...], tmp_path: Path) -> None:
    """A parent that is a plain file: one line with the path and the reason, exit 2, no traceback;
    a build says so before any work (nothing written)."""
    (tmp_path / "plain-file").write_text("not a folder")
    (tmp_path / "work" / "m").mkdir(parents=True)
    (tmp_path / "work" / "m" / "manifest.json").write_text('{"stages": [], "results": {}, "artifacts": {}}')
    line = one_line_error(cli(*argv, cwd=tmp_path), status=2)
    assert "plain-file is a file, not a folder" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain-file", "work"]


def test_file_system_errors_name_the_path_and_the_reason(tmp_path: Path) -> None:
    import errno

    from pipeline.core.errors import path_error, require_creatable

    denied = path_error(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "x")))
    assert denied.problem == f"cannot use {tmp_path / 'x'}: permission denied" and "permissions" in (denied.fix or "")
    full = path_error(OSError(errno.ENOSPC, "No space left on device", "/data/out"))
    assert full.problem == "cannot use /data/out: no space left on device" and "free space" in (full.fix or "")
    require_creatable(tmp_path / "a" / "b", "--workdir")  # a new folder under a writable one: fine
    (tmp_path / "f").write_text("")
    with pytest.raises(PipelineError, match=r"--workdir .*/f/b: .*/f is a file, not a folder"):
        require_creatable(tmp_path / "f" / "b", "--workdir")
