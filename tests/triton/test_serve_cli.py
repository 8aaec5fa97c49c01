"""`serve` as a user runs it: a real process, N pinned servers, SIGTERM, clean exit, nothing left behind."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.commands.serve import cpu_shares
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


def test_write_view_switches_only_the_config_in_use_to_cpu(repository: Path, tmp_path: Path) -> None:
    """No GPU: a KIND_GPU config (here configs/1g.5gb.pbtxt, as mig-plan writes) is served as KIND_CPU
    with the same count; everything else in the view still points at the untouched repository."""
    from tritonclient.grpc import model_config_pb2 as mc

    from pipeline.triton.config import config_text, parse_config
    from pipeline.triton.servable import write_view

    repo = tmp_path / "repo"
    shutil.copytree(repository / "tiny", repo / "tiny")
    shutil.copytree(repository / "ids", repo / "ids")
    gpu = parse_config((repo / "tiny" / "config.pbtxt").read_text())
    gpu.instance_group[0].kind = mc.ModelInstanceGroup.KIND_GPU
    gpu.instance_group[0].count = 3
    gpu.instance_group[0].gpus.append(0)
    (repo / "tiny" / "configs").mkdir()
    (repo / "tiny" / "configs" / "1g.5gb.pbtxt").write_text(config_text(gpu))
    view = tmp_path / "view"
    view.mkdir()
    assert write_view(repo, ["ids", "tiny"], view, "1g.5gb", cpu_only=True) == ["tiny"]
    served = parse_config((view / "tiny" / "configs" / "1g.5gb.pbtxt").read_text())
    assert [(g.kind, g.count, list(g.gpus)) for g in served.instance_group] == [(mc.ModelInstanceGroup.KIND_CPU, 3, [])]
    assert (view / "tiny" / "1").is_symlink() and (view / "tiny" / "config.pbtxt").is_symlink() and (view / "ids").is_symlink()
    assert parse_config((repo / "tiny" / "configs" / "1g.5gb.pbtxt").read_text()) == gpu  # on disk: unchanged
    other = tmp_path / "view2"
    other.mkdir()
    assert write_view(repo, ["tiny"], other, "1g.5gb", cpu_only=False) == []
    # A GPU host: GPU instances stay, and the Python backend passes GPU inputs on as GPU tensors.
    on_gpu = parse_config((other / "tiny" / "configs" / "1g.5gb.pbtxt").read_text())
    assert on_gpu.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value == "no"
    del on_gpu.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"]
    assert on_gpu == gpu and (other / "tiny" / "1").is_symlink()


@pytest.mark.slow
def test_serve_rehearses_a_gpu_config_on_cpu_and_logs_under_the_workdir(repository: Path, tmp_path: Path) -> None:
    """`serve --model-config-name 1g.5gb --workdir wd`, run from another directory with relative paths:
    the KIND_GPU per-profile config loads as KIND_CPU (one line says so), and the server log is
    <workdir>/triton/tritonserver-<port>.log relative to where serve ran, and its path is printed."""
    from tritonclient.grpc import model_config_pb2 as mc

    from pipeline.triton.config import config_text, parse_config

    cwd = tmp_path / "elsewhere"
    (cwd / "migrepo").mkdir(parents=True)
    shutil.copytree(repository / "tiny", cwd / "migrepo" / "tiny")
    gpu = parse_config((cwd / "migrepo" / "tiny" / "config.pbtxt").read_text())
    gpu.instance_group[0].kind = mc.ModelInstanceGroup.KIND_GPU
    (cwd / "migrepo" / "tiny" / "configs").mkdir()
    (cwd / "migrepo" / "tiny" / "configs" / "1g.5gb.pbtxt").write_text(config_text(gpu))
    output_path = tmp_path / "output.txt"
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="400")
    with open(output_path, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "serve", "--repository", "migrepo", "--model-config-name", "1g.5gb",
             "--workdir", "wd", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
            cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 120
            while "ready; Ctrl-C" not in output_path.read_text() and process.poll() is None:
                assert time.monotonic() < deadline, output_path.read_text()
                time.sleep(0.2)
            output = output_path.read_text()
            assert process.poll() is None, output
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0, output_path.read_text()
    assert "no GPU here: serving the KIND_GPU instances of tiny (configs/1g.5gb.pbtxt where present) as KIND_CPU" in output
    assert "models=tiny" in output
    [log_file] = list((cwd / "wd" / "triton").glob("tritonserver-*.log"))
    assert f"log={log_file}" in output and log_file.stat().st_size > 0
    assert not (ROOT / "wd").exists()
