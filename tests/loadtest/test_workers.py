"""``loadtest --workers N`` against the real embedded tritonserver: several processes, one report,
every latency sample merged (so the counts are Triton's), and a worker that dies is named while
the others' results are kept."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from pipeline.loadtest.client import endpoint_from_url
from pipeline.loadtest.measure import WindowSettings, measure
from pipeline.loadtest.policy import ClosedLoop, OpenLoop
from pipeline.loadtest.runner import run_loadtest
from pipeline.loadtest.server_stats import fetch_counters
from pipeline.loadtest.workers import EngineSpec, WorkerPool

from .test_runner import check_point, settings

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_two_workers_give_one_point_whose_counts_are_tritons(server: object, workspace: Path, protocol: str) -> None:
    result = run_loadtest(settings(server, workspace, [ClosedLoop(3), OpenLoop(150, "poisson")], workers=2, protocol=protocol))
    assert not result.failures and result.generator["processes"] == 2
    for point in result.points:
        check_point(point)  # client successes over the whole point == Triton's, from both processes
        assert point.incomplete is None
    lag = result.points[1].aggregate.send_lag
    assert lag is not None and lag.count > 0 and lag.p50_ms >= 0  # both workers' schedule lateness, merged


def test_a_worker_killed_mid_point_is_named_and_the_others_are_kept(server: object, workspace: Path) -> None:
    s = settings(server, workspace, [ClosedLoop(2)])
    endpoint = endpoint_from_url(server.http_url)  # type: ignore[attr-defined]
    from pipeline.loadtest import payload as pl
    from pipeline.loadtest.runner import _targets
    from pipeline.loadtest.targets import model_io

    io = model_io(endpoint, "add")
    batches = pl.request_batches(pl.load_samples(workspace / "calibration" / "add" / "eval.npz"), io, 1, 4)
    spec = EngineSpec("http", _targets(s, io, batches), 2.0, 16)
    with WorkerPool(2, spec) as pool:
        engine = pool.engine(ClosedLoop(2))
        victim = pool.workers[1].process

        def fetch():  # type: ignore[no-untyped-def]
            if engine.recorders[0].latency_ns and victim.is_alive():
                os.kill(victim.pid, signal.SIGKILL)  # after the warm-up, while the windows run
            return fetch_counters(endpoint, "add")

        m = measure(engine, WindowSettings(window_s=0.3, warmup_s=0.2, max_s=2.0, drain_s=2.0), [fetch], cpu=engine.cpu_seconds)
        (failure,) = engine.failures
        assert failure.startswith("worker 1: process") and "exited (code -9)" in failure
        assert m.windows and len(m.recorders[0].latency_ns) > 0  # worker 0 went on

        later = pool.engine(ClosedLoop(2))  # the next point of the sweep: its share is missing too, and said so
        later.start()
        bound = time.perf_counter_ns() + 60_000_000_000  # only against a hang
        while not later.recorders[0].latency_ns and time.perf_counter_ns() < bound:
            later.run_until(time.perf_counter_ns() + 50_000_000)
        later.finish(2.0)
        assert later.failures == [f"worker 1: process {victim.pid} exited before this point (code -9)"]



def test_cli_workers_write_one_report_whose_counts_are_tritons(server: object, workspace: Path, tmp_path: Path) -> None:
    from .test_cli import FAST, run_cli

    status = run_cli("--url", server.http_url, "--metrics-url", server.metrics_url, "--model", "add", "--workers", "2",  # type: ignore[attr-defined]
                     "--concurrency", "16", "--calibration-root", str(workspace / "calibration"), "--report-dir", str(tmp_path), *FAST)
    assert status in (0, 1)  # 1 only for an unstable point on a busy machine: the counts below hold either way
    payload = json.loads((tmp_path / "results.json").read_text())
    (point,) = payload["points"]
    assert payload["generator"]["processes"] == 2 and point["incomplete"] is None
    agg = point["aggregate"]
    assert agg["client_successes_total"] == agg["server_successes_total"] > 0 and agg["error_count"] == 0
    # Prometheus covers the same whole point (batch 1: one inference per request) and says over how long
    metrics = agg["metrics"]
    assert metrics["inferences"] == agg["server_successes_total"]
    assert metrics["seconds"] >= point["wall_seconds"] and metrics["infer_per_s"] == metrics["inferences"] / metrics["seconds"]
