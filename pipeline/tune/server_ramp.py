"""A trial's ramp in MLPerf's terms (``tune --scenario server``): each point is one run of MLPerf's LoadGen in the
Server scenario at a target QPS, Poisson arrivals, the SLO as its latency bound and LoadGen's early stopping; the
point meets the SLO when LoadGen says VALID and no request failed. The candidate's score is the highest VALID
target QPS.

The target doubles from the start until a run is INVALID (a break is run again, as in the load-test ramp: one stall
of a busy machine can break a p99), then :data:`BISECTIONS` runs halve the gap between the highest VALID target and
the lowest INVALID one. Each point's four LoadGen logs go to ``<logs>/<target QPS>/`` when a folder is given."""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.loadtest.engine import HttpEngine
from pipeline.loadtest.loadgen.settings import ScenarioSettings
from pipeline.loadtest.loadgen.verdict import ScenarioVerdict
from pipeline.loadtest.policy import ClosedLoop
from pipeline.tune.targets import Target

log = logging.getLogger(__name__)

BISECTIONS = 3  # the highest VALID target within 1/8 of the first doubling that broke
WARM_UP_S = 1.0
EXTEND_AT_MOST = 10  # a run early stopping cannot confirm is run again with the queries it asks for: 10× as many at most (or 1,000)
WARM_UP_CONCURRENCY = 4
RAMP = (f"warm-up {WARM_UP_S:g} s at concurrency {WARM_UP_CONCURRENCY}; target QPS x2 until INVALID (a break run twice), then {BISECTIONS} "
        f"bisections; LoadGen Server, early stopping (a run short of queries for it run again with 1.1 x those LoadGen asks for, up to "
        f"{EXTEND_AT_MOST} x its queries or 1000)")

Measure = Callable[[float], dict[str, Any]]  # one point at a target QPS


@dataclass(frozen=True)
class ServerRamp:
    """The ramp's settings (from the trial's: pipeline.tune.trial.TrialSettings.server_ramp)."""

    slo_p99_ms: float  # each run's latency bound
    start: float  # the first target QPS
    max_load: float  # no target above it
    min_duration_s: float = 5.0
    timeout_s: float = 5.0
    max_connections: int = 256


def server_ramp(target: Target, model: str, bodies: list[bytes], ramp: ServerRamp, logs: Path | None = None) -> list[dict[str, Any]]:
    """The Server-scenario ramp of the loaded model (``bodies``: its encoded requests), point by point, after a warm-up."""
    warm_up(target, bodies, ramp)
    return ramp_points(ramp, lambda qps: server_point(target, model, bodies, ramp, qps, logs))


def warm_up(target: Target, bodies: list[bytes], ramp: ServerRamp, seconds: float = WARM_UP_S) -> None:
    """A closed loop of a few requests at a time, not measured: instances just loaded answer their first requests
    slowly (allocations, the runtime's first runs), and MLPerf's LoadGen has no warm-up of its own, so the first run
    of a trial would count them (measured here: a trial's first 400 QPS run had p99 21 ms, the same run again 6 ms)."""
    engine = HttpEngine([(target.endpoint, bodies)], ClosedLoop(WARM_UP_CONCURRENCY), timeout_s=ramp.timeout_s, max_connections=WARM_UP_CONCURRENCY)
    engine.start()
    engine.run_until(time.perf_counter_ns() + int(seconds * 1e9))
    engine.finish(ramp.timeout_s)


def ramp_points(ramp: ServerRamp, measure: Measure) -> list[dict[str, Any]]:
    """The ramp itself, each point measured by ``measure``: double from ``ramp.start`` until INVALID twice (kept as
    one point, ``retried``), then bisect; the points in the order run."""
    points: list[dict[str, Any]] = []
    qps = ramp.start
    broke: float | None = None
    while qps <= ramp.max_load:
        point = measure(qps)
        points.append(point)
        if not point["meets_slo"]:
            again = measure(qps)
            if again["meets_slo"]:
                points[-1] = {**again, "retried": True}
            else:
                points[-1] = {**min(point, again, key=lambda p: p["p99_ms"] if p["p99_ms"] is not None else math.inf), "retried": True}
                broke = qps
                break
        qps *= 2
    good = [p["load"] for p in points if p["meets_slo"]]
    low = max(good) if good else None
    for _ in range(BISECTIONS if broke is not None and low is not None else 0):
        assert low is not None and broke is not None
        middle = round((low + broke) / 2, 1)
        if not low < middle < broke:
            break
        point = measure(middle)
        points.append(point)
        low, broke = (middle, broke) if point["meets_slo"] else (low, middle)
    return points


def server_point(target: Target, model: str, bodies: list[bytes], ramp: ServerRamp, qps: float, logs: Path | None = None) -> dict[str, Any]:
    """One LoadGen Server run at ``qps`` against the loaded model: a ramp point (load, completed samples/s, p50/p99,
    errors, LoadGen's result and reasons)."""
    scenario = ScenarioSettings(scenario="server", target_qps=qps, latency_bound_ms=ramp.slo_p99_ms, min_duration_s=ramp.min_duration_s)
    verdict, errors = _run(target, model, bodies, ramp, scenario, logs / f"{qps:g}" if logs is not None else None)
    if verdict.more_queries is not None and verdict.more_queries <= max(EXTEND_AT_MOST * (verdict.query_count or 0), 1000):
        # Within the bound, but too few queries for early stopping to confirm the percentile: LoadGen names how many
        # more it needs. A short run at a low target would otherwise stop the ramp for its length, not its latency.
        wanted = math.ceil(((verdict.query_count or 0) + verdict.more_queries) * 1.1)
        log.info("  target QPS %g: early stopping asks for %d more queries; running %d", qps, verdict.more_queries, wanted)
        verdict, errors = _run(target, model, bodies, ramp, replace(scenario, min_query_count=wanted), logs / f"{qps:g}" if logs is not None else None)
    p = verdict.percentiles_ns
    reasons = list(verdict.reasons) + ([f"{errors} requests failed"] if errors else [])
    point: dict[str, Any] = {
        "load": qps,
        "infer_per_s": round(verdict.value or 0.0, 1),
        "p50_ms": _ms(p.get("50.00")),
        "p99_ms": _ms(p.get("99.00")),
        "errors": errors,
        "stable": True,  # LoadGen's verdict takes the place of the windows' stability check
        "overloaded": False,
        "avg_batch": None,
        "queue_us": None,
        "aborted": None,
        "meets_slo": verdict.valid and not errors,
        "result": verdict.result,
        "reasons": reasons,
    }
    log.info("  target QPS %g: %s, %.0f samples/s, p99 %s ms%s", qps, verdict.result, point["infer_per_s"], point["p99_ms"],
             "" if point["meets_slo"] else f" ({'; '.join(reasons) or 'INVALID'})")
    return point


def _run(target: Target, model: str, bodies: list[bytes], ramp: ServerRamp, scenario: ScenarioSettings, logs: Path | None) -> tuple[ScenarioVerdict, int]:
    """One LoadGen run of ``scenario`` (its logs in ``logs``, or thrown away): its verdict and the failed requests."""
    from pipeline.loadtest.loadgen.http_sut import TritonSut
    from pipeline.loadtest.loadgen.run import run_scenario

    sut = TritonSut(model, target.endpoint, bodies, "server", timeout_s=ramp.timeout_s, max_connections=ramp.max_connections)
    with tempfile.TemporaryDirectory(prefix="loadgen-") as scratch:
        sut.start()
        try:
            verdict = run_scenario(scenario, sut, len(bodies), logs or Path(scratch), trace=False)
        finally:
            sut.stop()
    return verdict, sum(sut.engine.recorder.errors.values())


def _ms(ns: float | None) -> float | None:
    return round(ns / 1e6, 3) if ns is not None else None
