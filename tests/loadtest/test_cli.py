"""`loadtest` from the command line: reports, exit status, SLO verdict, clear errors."""

from __future__ import annotations

import argparse
import csv
import json
import socket
from pathlib import Path

import pytest

from pipeline.commands.loadtest import register
from pipeline.core.errors import PipelineError

FAST = ["--window-ms", "300", "--warmup-ms", "200", "--max-seconds", "2", "--timeout-ms", "2000"]


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["loadtest", *argv])
    return int(args.handler(args))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_url_fails_fast_and_clearly(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"cannot reach Triton at 127\.0\.0\.1:\d+") as err:
        run_cli("--url", f"127.0.0.1:{free_port()}", "--report-dir", str(tmp_path / "report"), *FAST)
    assert err.value.fix and "--url" in err.value.fix
    assert not (tmp_path / "report").exists()  # fast: refused by the first probe, before any load point ran


def test_bad_options_fail_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="--max-seconds"):
        run_cli("--repository", str(tmp_path / "nothing"), "--window-ms", "1000", "--max-seconds", "2")
    with pytest.raises(PipelineError, match="--concurrency"):
        run_cli("--repository", str(tmp_path / "nothing"), "--concurrency", "0")


@pytest.mark.slow
def test_model_not_ready_names_the_ready_ones(server: object, workspace: Path) -> None:
    with pytest.raises(PipelineError, match=r"model 'nope' is not ready .*ready: add, sleepy"):
        run_cli("--url", server.http_url, "--model", "nope", *FAST)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_reports_and_slo_verdict(server: object, workspace: Path, tmp_path: Path) -> None:
    common = ["--url", server.http_url, "--model", "add", "--calibration-root", str(workspace / "calibration"),  # type: ignore[attr-defined]
              "--concurrency", "1,2", *FAST]  # fmt: skip
    assert run_cli(*common, "--slo-p99-ms", "10000", "--report-dir", str(tmp_path / "ok")) == 0
    report = json.loads((tmp_path / "ok" / "results.json").read_text())
    assert [p["load"] for p in report["points"]] == [1.0, 2.0]
    assert report["slo"]["met"] and report["slo"]["best_point"]["model"] == "add"
    with open(tmp_path / "ok" / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 and rows[0]["server_successes_total"] == rows[0]["client_successes_total"]
    for png in ("latency_vs_throughput.png", "latency_vs_concurrency.png"):
        assert (tmp_path / "ok" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert run_cli(*common, "--slo-p99-ms", "0.000001", "--report-dir", str(tmp_path / "miss")) == 1
    missed = json.loads((tmp_path / "miss" / "results.json").read_text())
    assert missed["slo"] == {"p99_ms": 1e-06, "met": False, "best_point": None}


@pytest.mark.slow
def test_without_url_starts_the_embedded_server_and_tests_every_variant(workspace: Path, tmp_path: Path) -> None:
    code = run_cli("--repository", str(workspace / "model_repository"), "--calibration-root", str(workspace / "calibration"),
                   "--data", str(workspace / "calibration" / "add" / "eval.npz"), "--concurrency", "1", *FAST,
                   "--report-dir", str(tmp_path))  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "results.json").read_text())
    assert sorted(p["model"] for p in report["points"]) == ["add", "sleepy"]
