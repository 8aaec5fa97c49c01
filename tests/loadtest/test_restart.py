"""A server that survives: `serve`'s tritonserver killed with SIGKILL comes back ready, the cause and the
restart in the log, and a load test running across the kill (over system shared memory, registered again
with the new server) names the window the restart fell in."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.loadtest.client import Endpoint, request_json
from pipeline.triton.supervisor import RESTART_BACKOFF_S, restart_delay

ROOT = Path(__file__).resolve().parents[2]


def test_the_backoff_grows_then_stays_at_its_last_delay() -> None:
    assert [restart_delay(n) for n in range(1, len(RESTART_BACKOFF_S) + 1)] == list(RESTART_BACKOFF_S)
    assert restart_delay(len(RESTART_BACKOFF_S) + 5) == RESTART_BACKOFF_S[-1]
    assert list(RESTART_BACKOFF_S) == sorted(RESTART_BACKOFF_S)


def _wait_for(what: str, check: object, timeout: float, output: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not seen within {timeout:g} s; output:\n{output.read_text()}"
        time.sleep(0.1)


def _tritonserver_child(parent: int) -> int:
    """The tritonserver process `serve` started (its direct child running the tritonserver binary)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and cmdline.endswith(b"tritonserver"):
            return int(entry.name)
    raise AssertionError(f"no tritonserver child of {parent}")


def _ready(endpoint: Endpoint) -> bool:
    try:
        return request_json(endpoint, "GET", "/v2/health/ready", timeout=2.0)[0] == 200
    except OSError:
        return False


def _successes(endpoint: Endpoint) -> int:
    try:
        status, stats = request_json(endpoint, "GET", "/v2/models/add/stats", timeout=2.0)
    except OSError:
        return 0
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"]) if status == 200 else 0  # type: ignore[index]


@pytest.mark.slow
def test_a_killed_tritonserver_comes_back_and_the_load_test_names_the_window(workspace: Path, tmp_path: Path) -> None:
    serve_out, load_out = tmp_path / "serve.txt", tmp_path / "loadtest.txt"
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="400")
    serve = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "serve", "--repository", str(workspace / "model_repository"),
         "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--workdir", str(tmp_path / "work")],
        cwd=ROOT, env=env, stdout=open(serve_out, "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    load = None
    try:
        _wait_for("serve's ready line", lambda: "ready; Ctrl-C" in serve_out.read_text() or serve.poll() is not None, 120, serve_out)
        text = serve_out.read_text()
        assert serve.poll() is None, text
        port = int(text.split("http=127.0.0.1:")[1].split()[0])
        endpoint = Endpoint("127.0.0.1", port)
        # Stability made unreachable, so the point runs to --max-seconds, across the kill and the restart;
        # over system shared memory, which the restarted server has to be given again.
        load = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "-v", "loadtest", "--url", f"127.0.0.1:{port}", "--model", "add",
             "--calibration-root", str(workspace / "calibration"), "--concurrency", "2", "--window-ms", "500",
             "--warmup-ms", "500", "--max-seconds", "45", "--stability-percentage", "0.0001", "--restart-wait-s", "40",
             "--timeout-ms", "2000", "--shared-memory", "system", "--report-dir", str(tmp_path / "report")],
            cwd=ROOT, env=env, stdout=open(load_out, "wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        # the first measurement window is logged (-v) once the warm-up is over: the kill falls in the windows
        _wait_for("the first measurement window", lambda: "window 1:" in load_out.read_text() or load.poll() is not None, 60, load_out)
        assert load.poll() is None and _successes(endpoint) > 0, load_out.read_text()

        killed = _tritonserver_child(serve.pid)
        os.kill(killed, signal.SIGKILL)
        _wait_for("the restart", lambda: "restarted (restart 1" in serve_out.read_text() or serve.poll() is not None, 120, serve_out)
        assert serve.poll() is None, serve_out.read_text()
        assert _ready(endpoint)
        assert _tritonserver_child(serve.pid) != killed
        text = serve_out.read_text()
        assert f"tritonserver on 127.0.0.1:{port} died: killed by SIGKILL" in text
        assert f"restarting tritonserver on 127.0.0.1:{port} in {RESTART_BACKOFF_S[0]:g} s" in text

        assert load.wait(timeout=120) == 1, load_out.read_text()  # requests failed while it was down
    finally:
        for process in (load, serve):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    (point,) = json.loads((tmp_path / "report" / "results.json").read_text())["points"]
    assert point["disrupted"], point
    assert any("went away or restarted" in w for w in point["disrupted"])
    last = max(int(w.split()[1].rstrip(":")) for w in point["disrupted"])
    assert point["windows"] - last >= point["used_windows"] == 3  # the statistics use only windows after the restart
    assert point["aborted"] is None and point["encoding"] == "system-shm"
    assert point["aggregate"]["requests"] > 0  # the windows after the restart ran: the regions were registered again
    assert "left out of the statistics" in load_out.read_text()
