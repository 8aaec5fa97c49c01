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
from tests.triton.conftest import shm_entries

# The lead wires `serve` into pipeline/cli.py; this harness runs the same register()/run() pair.
HARNESS = """
import argparse, logging, sys
from pipeline.errors import PipelineError
from pipeline.triton import serve_cli
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
parser = argparse.ArgumentParser()
serve_cli.register(parser.add_subparsers())
args = parser.parse_args(sys.argv[1:])
try:
    sys.exit(args.handler(args))
except PipelineError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
"""


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
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", HARNESS, "serve", "--repository", str(repository), "--slices", "2",
             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--log-file", str(log_file)],
            stdout=subprocess.DEVNULL, stderr=stderr,
        )
        deadline = time.monotonic() + 120
        while "ready; Ctrl-C" not in stderr_path.read_text() and process.poll() is None:
            assert time.monotonic() < deadline, stderr_path.read_text()
            time.sleep(0.2)
        output = stderr_path.read_text()
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
        assert process.wait(timeout=20) == 0, stderr_path.read_text()
        idle.close()
    assert "SIGTERM received; stopping" in stderr_path.read_text()
    assert processes_mentioning(str(tmp_path)) == []
    assert shm_entries(process.pid) == set()
    assert (tmp_path / "serve-slice0.log").stat().st_size > 0 and (tmp_path / "serve-slice1.log").stat().st_size > 0
