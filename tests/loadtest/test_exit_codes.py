"""`python -m pipeline loadtest` exit status, for real in a subprocess: 0 ran and passed, 1 a measured
check failed (SLO, failed requests), 2 bad usage or input (before any server starts), 130 Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from pipeline.commands.loadtest import register
from pipeline.core.errors import PipelineError
from tests.conftest import ROOT, cli, interrupt_when_ready, one_line_error, popen_interruptible

FAST = ["--window-ms", "300", "--warmup-ms", "200", "--max-seconds", "2", "--timeout-ms", "2000"]
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def run_inprocess(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["loadtest", *argv])
    return int(args.handler(args))


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    line = one_line_error(cli("loadtest", "--repository", str(tmp_path), "--concurrency", "0"))
    assert "--concurrency" in line
    assert not (tmp_path / "reports").exists()


def test_a_misspelled_model_fails_before_the_server_starts(workspace: Path) -> None:
    # "are not in <repository> (it has: …)" is the repository check; the server's own check would
    # say "not served from" after a start of several seconds.
    with pytest.raises(PipelineError, match=r"model\(s\) ad are not in .*model_repository \(it has: add, sleepy\)") as err:
        run_inprocess("--repository", str(workspace / "model_repository"), "--model", "ad", *FAST)
    assert err.value.fix and "--model" in err.value.fix


def test_missing_samples_name_the_file_and_the_flags_that_give_them(workspace: Path, tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"no evaluation samples for model 'add' \(none recorded by its build, no .*nowhere/add/eval\.npz\)") as err:
        run_inprocess("--repository", str(workspace / "model_repository"), "--model", "add",
                      "--calibration-root", str(tmp_path / "nowhere"), *FAST)  # fmt: skip
    assert err.value.fix and "--data" in err.value.fix and "--eval-data" in err.value.fix


@pytest.mark.slow
def test_ok_is_0_and_a_missed_slo_is_1(server: object, workspace: Path, tmp_path: Path) -> None:
    common = ["loadtest", "--url", server.http_url, "--model", "add", "--calibration-root", str(workspace / "calibration"),  # type: ignore[attr-defined]
              "--concurrency", "1", *FAST]  # fmt: skip
    ok = cli(*common, "--report-dir", str(tmp_path / "ok"))
    assert ok.returncode == 0, ok.stderr[-2000:]
    missed = cli(*common, "--slo-p99-ms", "0.000001", "--report-dir", str(tmp_path / "miss"))
    assert missed.returncode == 1, missed.stderr[-2000:]
    assert "no point meets it" in missed.stdout and "Traceback" not in missed.stderr
    assert json.loads((tmp_path / "miss" / "results.json").read_text())["slo"]["met"] is False


def _executions(server: object, model: str) -> int:
    with _DIRECT.open(f"http://{server.http_url}/v2/models/{model}/stats", timeout=5) as response:  # type: ignore[attr-defined]
        return int(json.loads(response.read())["model_stats"][0]["execution_count"])


@pytest.mark.slow
def test_ctrl_c_exits_130_and_writes_no_report(server: object, workspace: Path, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "pipeline", "loadtest", "--url", server.http_url, "--model", "sleepy",  # type: ignore[attr-defined]
               "--calibration-root", str(workspace / "calibration"), "--concurrency", "1", "--max-seconds", "600",
               "--report-dir", str(reports)]  # fmt: skip
    before = _executions(server, "sleepy")
    process = popen_interruptible(command, cwd=ROOT, env=env)
    # Interrupt only once the load runs: the server has executed requests from this client.
    interrupt_when_ready(process, lambda: _executions(server, "sleepy") >= before + 5, "the load reaching the server", poll_s=0.2)
    assert not reports.exists()
