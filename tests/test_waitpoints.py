"""pipeline/waitpoints.py: a process waits at a named point only when asked, after writing the marker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = "from pipeline.waitpoints import wait_point; wait_point('a'); print('passed a', flush=True); wait_point('b'); print('passed b')"


def test_only_the_named_point_waits(tmp_path: Path) -> None:
    marker = tmp_path / "at-b"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PIPELINE_WAIT_AT="b", PIPELINE_WAIT_MARKER=str(marker))
    proc = subprocess.Popen([sys.executable, "-c", CODE], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "passed a"
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        assert marker.read_text().strip() == str(proc.pid) and proc.poll() is None  # waiting at b
    finally:
        proc.send_signal(signal.SIGKILL)
        out = proc.communicate()[0]
    assert "passed b" not in out


def test_without_the_variables_nothing_waits() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_WAIT")}
    proc = subprocess.run([sys.executable, "-c", CODE], env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60)
    assert proc.stdout.split("\n")[:2] == ["passed a", "passed b"]
