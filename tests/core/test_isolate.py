"""pipeline/core/isolate.py: a function runs in a spawned child; its value, user errors and bugs come back."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.errors import CheckFailed, PipelineError, require
from pipeline.core.isolate import call_in_child
from tests.conftest import ROOT


def test_the_function_runs_in_another_process_and_its_value_comes_back() -> None:
    assert call_in_child(os.getpid) != os.getpid()
    assert call_in_child(divmod, 17, 5) == (3, 2)


def test_a_user_error_in_the_child_is_raised_here_unchanged() -> None:
    with pytest.raises(PipelineError, match="^no such thing — make one$") as caught:
        call_in_child(require, False, "no such thing", "make one")
    assert (caught.value.problem, caught.value.fix, caught.value.exit_code) == ("no such thing", "make one", 2)


def test_a_check_failure_keeps_its_type_across_processes() -> None:
    import pickle

    again = pickle.loads(pickle.dumps(CheckFailed("gate failed", "look at the report")))
    assert type(again) is CheckFailed and (again.problem, again.fix, again.exit_code) == ("gate failed", "look at the report", 1)


def _disk_full(path: str) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/work/model.onnx.data", None, path)  # as shutil's copy raises it


def test_a_full_disk_in_the_child_comes_back_as_one_line_naming_the_file_being_written() -> None:
    with pytest.raises(PipelineError) as caught:
        call_in_child(_disk_full, "/work/.tmp/prepared.onnx.data")
    assert str(caught.value) == ("cannot use /work/.tmp/prepared.onnx.data: no space left on device — "
                                 "free space on that disk or choose a path on another one")


def test_a_bug_in_the_child_comes_back_with_its_traceback() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)builtins\.int failed in its child process:.*ValueError: invalid literal"):
        call_in_child(int, "not a number")


def _state(pid: int) -> str | None:
    """The process's state letter (``Z`` once it is a zombie), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
@pytest.mark.parametrize("point", ["savedmodel.export", "tf2onnx.convert"])
def test_a_killed_build_takes_its_child_process_with_it(point: str, tmp_path: Path) -> None:
    """SIGKILL the build while its child (the SavedModel export child, the tf2onnx subprocess) is
    held at a pause point: the child must not go on converting, orphaned (it did, for minutes)."""
    marker = tmp_path / "paused"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", PIPELINE_PAUSE_AT=point, PIPELINE_PAUSE_FILE=str(marker))
    command = [sys.executable, "-m", "pipeline", "build", "--workdir", str(tmp_path / "build"), "--repository", str(tmp_path / "repo")]
    log = tmp_path / "build.log"
    with open(log, "wb") as out:
        build = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while not marker.exists():
            assert build.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        child = int(marker.read_text())
        assert child != build.pid and _parent(child) == build.pid
        build.kill()
        build.wait()
        deadline = time.monotonic() + 60
        while _state(child) not in (None, "Z"):
            assert time.monotonic() < deadline, f"the {point} child (pid {child}) is still running after its build was killed"
            time.sleep(0.1)
    finally:
        if build.poll() is None:
            build.kill()
            build.wait()
        if marker.exists() and _state(int(marker.read_text())) not in (None, "Z"):
            os.kill(int(marker.read_text()), signal.SIGKILL)
