"""`serve` as a user runs it: a real process, N pinned servers, SIGTERM, clean exit, nothing left behind."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.triton.serve_cli import cpu_shares
from tests.conftest import ROOT
from tests.triton.conftest import shm_entries


def test_cpu_shares_split_cores_contiguously() -> None:
    assert cpu_shares([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert cpu_shares([0, 1], 2) == [[0], [1]]
    assert cpu_shares([0, 1], 3) == [[0], [1], [0]]


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.slow
def test_serve_two_slices_until_sigterm_then_exit_0_cleanly(repository: Path, tmp_path: Path) -> None:
    log_file = tmp_path / "serve.log"
    output_path = tmp_path / "output.txt"  # the CLI logs (rich) to stdout, errors to stderr: both go here
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="400")  # wide enough that no log line wraps
    with open(output_path, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "serve", "--repository", str(repository), "--slices", "2",
             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--log-file", str(log_file)],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120
        while "ready; Ctrl-C" not in output_path.read_text() and process.poll() is None:
            assert time.monotonic() < deadline, output_path.read_text()
            time.sleep(0.2)
        output = output_path.read_text()
        assert process.poll() is None, output
        servers = processes_mentioning(str(tmp_path))
        servers.remove(process.pid)
        assert len(servers) == 2, output
        pinned = sorted(Path(f"/proc/{pid}/status").read_text().split("Cpus_allowed_list:")[1].split()[0] for pid in servers)
        assert pinned == (["0", "1"] if len(os.sched_getaffinity(0)) >= 2 else ["0", "0"])
        assert "slice 0" in output and "slice 1" in output and "http=127.0.0.1:" in output
        assert shm_entries(process.pid)

        # An idle keep-alive client connection must not hold the shutdown for Triton's default 30 s.
        http_port = int(output.split("slice 0")[1].split("http=127.0.0.1:")[1].split()[0])
        idle = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
        idle.request("GET", "/v2/health/ready")
        assert idle.getresponse().status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0, output_path.read_text()
        idle.close()
    assert "SIGTERM received; stopping" in output_path.read_text()
    assert processes_mentioning(str(tmp_path)) == []
    assert shm_entries(process.pid) == set()
    assert (tmp_path / "serve-slice0.log").stat().st_size > 0 and (tmp_path / "serve-slice1.log").stat().st_size > 0
