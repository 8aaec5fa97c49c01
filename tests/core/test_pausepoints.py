"""The pause-point test hook (pipeline/core/pausepoints.py), in real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

# Visits point "a" three times and "b" once, printing after each visit.
SCRIPT = """
from pipeline.core.pausepoints import pause_point
for step in ("a", "a", "b", "a"):
    pause_point(step)
    print(step, flush=True)
"""


def run(tmp_path: Path, pause_at: str | None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PIPELINE_PAUSE_FILE=str(tmp_path / "held"))
    env.pop("PIPELINE_PAUSE_AT", None)
    if pause_at is not None:
        env["PIPELINE_PAUSE_AT"] = pause_at
    return subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120  # a hang guard, not a speed limit
    while not path.is_file():
        assert proc.poll() is None, f"exited with {proc.returncode} before pausing"
        assert time.monotonic() < deadline, "never paused"
        time.sleep(0.02)


def test_without_the_variable_nothing_pauses(tmp_path: Path) -> None:
    proc = run(tmp_path, None)
    assert proc.communicate(timeout=120)[0].split() == ["a", "a", "b", "a"]
    assert proc.returncode == 0 and not (tmp_path / "held").exists()


def test_another_point_named_does_not_pause(tmp_path: Path) -> None:
    proc = run(tmp_path, "c")
    assert proc.communicate(timeout=120)[0].split() == ["a", "a", "b", "a"]
    assert not (tmp_path / "held").exists()


def test_holds_at_the_nth_visit_until_released(tmp_path: Path) -> None:
    proc = run(tmp_path, "a#2")
    try:
        wait_for(tmp_path / "held", proc)
        assert int((tmp_path / "held").read_text()) == proc.pid
        assert proc.poll() is None  # still held: the file alone does not let it go on
        (tmp_path / "held.release").touch()
        out = proc.communicate(timeout=120)[0].split()
    finally:
        proc.kill()
        proc.wait()
    # paused after the first "a" was printed; released, it ran to the end and paused no more
    assert out == ["a", "a", "b", "a"] and proc.returncode == 0


def test_held_process_dies_at_that_point_when_killed(tmp_path: Path) -> None:
    proc = run(tmp_path, "b")
    try:
        wait_for(tmp_path / "held", proc)
        proc.kill()
        out = proc.communicate(timeout=120)[0].split()
    finally:
        proc.kill()
        proc.wait()
    assert out == ["a", "a"] and proc.returncode == -9
