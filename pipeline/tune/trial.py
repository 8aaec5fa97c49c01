"""One trial: load a candidate config into a real Triton, then raise the load until p99 breaks the SLO.

Each load point is measured by the load tester (:func:`pipeline.loadtest.measure.measure`: warm-up,
windows until the last three agree, Triton's statistics over the same windows). The ramp doubles
the load (concurrency, or the request rate of an open loop) from ``start``; it stops at the first
point past the SLO (or with errors) — measured twice, since one stall of a busy machine can break
a p99 —, or when two doublings in a row gain under 3% (saturated:
more load only adds latency). Then one point between the last good and the first bad load
narrows the break. The candidate's score is its best point under the SLO. The latency at one
fixed load is measured for every candidate too, so they can be compared at equal load.

Where the server exports GPU gauges, the trial also measures the model's GPU memory: the model is
unloaded before the candidate loads, for a baseline without it (:mod:`pipeline.tune.gpu_memory`).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.loadtest import payload as pl
from pipeline.loadtest.client import post_request_bytes
from pipeline.loadtest.engine import HttpEngine
from pipeline.loadtest.measure import WindowSettings, measure
from pipeline.loadtest.policy import ClosedLoop, OpenLoop, Policy
from pipeline.loadtest.request_check import check_request
from pipeline.loadtest.runner import LoadTestSettings, point_from_measurement
from pipeline.loadtest.server_stats import fetch_counters
from pipeline.tune.gpu_memory import MIB, GpuMemory, MemoryMeter, Reading, record
from pipeline.tune.server_ramp import RAMP, ServerRamp, server_ramp
from pipeline.tune.space import Candidate
from pipeline.tune.targets import LoadRejected, Target

log = logging.getLogger(__name__)

SATURATION_GAIN = 0.03


@dataclass(frozen=True)
class TrialSettings:
    """How each candidate is measured: the load policy, the SLO and the measurement windows."""

    slo_p99_ms: float
    open_loop: bool = False  # False: concurrency ramp; True: request-rate ramp
    start: float = 1  # first concurrency (or request rate)
    max_load: float = 256  # the ramp stops here
    fixed_load: float = 4  # latency at this load is reported for every candidate
    arrivals: str = "constant"
    windows: WindowSettings = field(default_factory=lambda: WindowSettings(window_s=0.5, warmup_s=0.3, max_s=8.0))
    timeout_s: float = 5.0
    max_connections: int = 256
    scenario: str | None = None  # "server": each point is MLPerf's LoadGen Server run at a target QPS (pipeline.tune.server_ramp)
    min_duration_s: float = 5.0  # with a scenario: each run's minimum duration

    def server_ramp(self) -> ServerRamp:
        """The Server-scenario ramp these settings describe (``scenario`` set)."""
        return ServerRamp(self.slo_p99_ms, self.start, self.max_load, self.min_duration_s, self.timeout_s, self.max_connections)

    def policy(self, load: float) -> Policy:
        """The load-tester policy of one point of the ramp."""
        return OpenLoop(load, self.arrivals) if self.open_loop else ClosedLoop(int(load))

    @property
    def load_kind(self) -> str:
        """``concurrency``, ``request_rate``, or ``target_qps`` (LoadGen's Server scenario)."""
        if self.scenario is not None:
            return "target_qps"
        return "request_rate" if self.open_loop else "concurrency"

    def to_dict(self) -> dict[str, Any]:
        """What the cache key holds of the load policy and measurement (the SLO included)."""
        w = self.windows
        if self.scenario is not None:
            from importlib.metadata import version

            return {"slo_p99_ms": self.slo_p99_ms, "policy": self.load_kind, "scenario": self.scenario, "start": self.start,
                    "max_load": self.max_load, "min_duration_s": self.min_duration_s, "timeout_s": self.timeout_s,
                    "max_connections": self.max_connections, "ramp": RAMP,
                    "loadgen": version("mlcommons-loadgen")}
        return {"slo_p99_ms": self.slo_p99_ms, "policy": self.load_kind, "start": self.start, "max_load": self.max_load,
                "fixed_load": self.fixed_load, "arrivals": self.arrivals if self.open_loop else None,
                "window_s": w.window_s, "warmup_s": w.warmup_s, "max_s": w.max_s, "threshold": w.threshold,
                "timeout_s": self.timeout_s, "ramp": f"x2, saturation gain {SATURATION_GAIN}, a break measured twice, one refinement"}


@dataclass
class Trial:
    """One measured candidate (also what the cache stores)."""

    candidate: Candidate
    points: list[dict[str, Any]] = field(default_factory=list)  # the ramp, in the order measured
    slo_p99_ms: float = 0.0
    load_kind: str = "concurrency"
    fixed_load: float = 0.0
    error: str | None = None  # the server refused the config, or a point failed outright
    reload_s: float = 0.0
    seconds: float = 0.0
    cached: bool = False
    baseline: bool = False
    gpu_memory: GpuMemory | None = None  # None: not measured (no GPU gauges, or cached before it was)

    @property
    def best_point(self) -> dict[str, Any] | None:
        """The highest-throughput point meeting the SLO (LoadGen's Server scenario: the highest VALID target QPS)."""
        meeting = [p for p in self.points if p["meets_slo"]]
        by = "load" if self.load_kind == "target_qps" else "infer_per_s"
        return max(meeting, key=lambda p: p[by]) if meeting else None

    @property
    def closest_point(self) -> dict[str, Any] | None:
        """Without a point under the SLO: the one with the lowest p99 (how close it came)."""
        usable = [p for p in self.points if p["p99_ms"] is not None and not p["errors"]]
        return min(usable, key=lambda p: p["p99_ms"]) if usable else None

    @property
    def meets_slo(self) -> bool:
        """Whether some load met the SLO (and the config loaded)."""
        return self.error is None and self.best_point is not None

    @property
    def score(self) -> float:
        """Infer/s under the SLO (the Server scenario: the highest VALID target QPS); below zero (−p99) when nothing met
        it, so closer is better."""
        best = self.best_point
        if self.error is None and best is not None:
            return float(best["load" if self.load_kind == "target_qps" else "infer_per_s"])
        closest = self.closest_point
        return -float(closest["p99_ms"]) if closest else -math.inf

    @property
    def fixed(self) -> dict[str, Any] | None:
        """The point at the fixed load, if measured."""
        return next((p for p in self.points if p["load"] == self.fixed_load), None)

    def to_dict(self) -> dict[str, Any]:
        """The tune.json / cache entry: the issue's fields, then details and every ramp point."""
        point = self.best_point or self.closest_point
        fixed = self.fixed
        return {
            "config": self.candidate.to_dict(),
            "infer_per_s": point["infer_per_s"] if point else 0.0,
            "p99_ms": point["p99_ms"] if point else None,
            "load": {self.load_kind: point["load"]} if point else None,
            "meets_slo": self.meets_slo,
            "fixed_load": {self.load_kind: self.fixed_load, "p50_ms": fixed["p50_ms"], "p99_ms": fixed["p99_ms"],
                           "infer_per_s": fixed["infer_per_s"]} if fixed else None,
            "error": self.error,
            "baseline": self.baseline,
            "cached": self.cached,
            "reload_s": round(self.reload_s, 3),
            "seconds": round(self.seconds, 2),
            "gpu_memory": self.gpu_memory.to_dict() if self.gpu_memory else None,
            "points": self.points,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], settings: TrialSettings) -> Trial:
        """A trial back from the cache."""
        return cls(Candidate.from_dict(data["config"]), list(data["points"]), settings.slo_p99_ms, settings.load_kind,
                   settings.fixed_load, data.get("error"), float(data.get("reload_s", 0)), float(data.get("seconds", 0)),
                   cached=True, baseline=bool(data.get("baseline")), gpu_memory=GpuMemory.from_dict(data.get("gpu_memory")))


class Requests:
    """A model's pre-encoded requests for one target (built once, reused by every trial)."""

    def __init__(self, target: Target, model: str, max_batch: int, samples_path: Any) -> None:
        io = target.model_io(model, max_batch)
        batches = pl.request_batches(pl.load_samples(samples_path), io, 1, 16)
        encoded = [pl.encode(io, b, "binary") for b in batches]
        path = f"/v2/models/{io.name}/infer"
        self.bodies = [post_request_bytes(target.endpoint, path, body, head) for body, head in encoded]
        check_request(target.endpoint, io, self.bodies[0], batches[0])


def memory_meter(target: Target) -> MemoryMeter:
    """The GPU memory meter of a started target."""
    return MemoryMeter(target.metrics_endpoint, target.metrics_refresh_s)


def run_trial(target: Target, model: str, config: Any, candidate: Candidate, requests: Requests,
              settings: TrialSettings, *, baseline: bool = False, meter: MemoryMeter | None = None) -> Trial:
    """Load ``config`` and measure the ramp (and, with a ``meter`` that finds GPU gauges, the GPU memory)."""
    began = time.perf_counter()
    trial = Trial(candidate, slo_p99_ms=settings.slo_p99_ms, load_kind=settings.load_kind,
                  fixed_load=settings.fixed_load, baseline=baseline)
    unloaded = _unloaded_baseline(target, model, meter) if meter is not None else None
    try:
        trial.reload_s = target.load(model, config)
    except LoadRejected as exc:
        trial.error = f"the server refused this config: {exc}"
        log.warning("%s: %s", candidate.label, trial.error)
        trial.seconds = time.perf_counter() - began
        return trial
    loaded = meter.refreshed() if meter is not None and unloaded is not None else None
    if settings.scenario is not None:
        trial.points += server_ramp(target, model, requests.bodies, settings.server_ramp())
    elif settings.fixed_load not in _ramp(target, model, requests, settings, trial):
        trial.points.append(_point(target, model, requests, settings, settings.fixed_load))
    if meter is not None and unloaded is not None and loaded is not None:
        ramped = meter.refreshed()
        if ramped is not None:
            trial.gpu_memory = record(*unloaded, loaded, ramped, candidate.instance_count)
            log.info("  GPU memory: %.0f MiB for the model, %.0f MiB per instance", trial.gpu_memory.model_bytes / MIB,
                     trial.gpu_memory.per_instance_bytes / MIB)
    trial.seconds = time.perf_counter() - began
    return trial


def _unloaded_baseline(target: Target, model: str, meter: MemoryMeter) -> tuple[Reading, bool] | None:
    """Unload the model and read the gauges once they stop falling; None (and the model left
    loaded) when the server exports no GPU gauges."""
    if meter.read() is None:
        return None
    target.unload(model)
    return meter.settled()


def _ramp(target: Target, model: str, requests: Requests, settings: TrialSettings, trial: Trial) -> list[float]:
    loads: list[float] = []
    best = 0.0
    flat = 0
    load = settings.start
    broke: float | None = None
    while load <= settings.max_load:
        point = _point(target, model, requests, settings, load)
        trial.points.append(point)
        loads.append(load)
        if point["aborted"]:
            trial.error = f"load {load:g}: {point['aborted']}"
            return loads
        if not point["meets_slo"]:
            # One stall of a busy machine can break a p99: a break counts once it repeats.
            again = _point(target, model, requests, settings, load)
            if again["meets_slo"]:
                trial.points[-1] = {**again, "retried": True}
                point = trial.points[-1]
            else:
                trial.points[-1] = {**min(point, again, key=lambda p: p["p99_ms"] if p["p99_ms"] is not None else math.inf), "retried": True}
                broke = load
                break
        flat = flat + 1 if point["infer_per_s"] < best * (1 + SATURATION_GAIN) else 0
        best = max(best, point["infer_per_s"])
        if flat >= 2:
            break
        load *= 2
    good = [p["load"] for p in trial.points if p["meets_slo"]]
    if broke is not None and good:
        middle = math.sqrt(max(good) * broke)
        middle = round(middle) if not settings.open_loop else round(middle, 1)
        if max(good) < middle < broke:
            trial.points.append(_point(target, model, requests, settings, middle))
            loads.append(middle)
    return loads


def _point(target: Target, model: str, requests: Requests, settings: TrialSettings, load: float) -> dict[str, Any]:
    policy = settings.policy(load)
    engine = HttpEngine([(target.endpoint, requests.bodies)], policy, timeout_s=settings.timeout_s,
                        max_connections=settings.max_connections)
    fetch = functools.partial(fetch_counters, target.endpoint, model)
    offered = policy.rate if isinstance(policy, OpenLoop) else None
    measured = measure(engine, settings.windows, [fetch], offered)
    lt = LoadTestSettings(endpoints=(target.endpoint,), policies=(policy,), models=(model,), windows=settings.windows,
                          timeout_s=settings.timeout_s, max_connections=settings.max_connections)
    result = point_from_measurement(lt, model, policy, measured)
    agg = result.aggregate
    server = agg.server or {}
    batch = server.get("avg_batch_size")
    point = {
        "load": load,
        "infer_per_s": round(agg.infer_per_s, 1),
        "p50_ms": _ms(agg.latency.p50_ms),
        "p99_ms": _ms(agg.latency.p99_ms),
        "errors": agg.error_count,
        "stable": result.stable,
        "overloaded": result.overloaded,
        "avg_batch": round(batch, 2) if isinstance(batch, float) and math.isfinite(batch) else None,
        "queue_us": _ms(server.get("queue_us")),
        "aborted": result.aborted,
        "meets_slo": result.meets(settings.slo_p99_ms) and not result.overloaded,
    }
    log.info("  %s %g: %.0f infer/s, p99 %s ms%s", settings.load_kind, load, agg.infer_per_s, point["p99_ms"],
             "" if point["meets_slo"] else " (past the SLO)")
    return point


def _ms(value: Any) -> float | None:
    return round(float(value), 3) if isinstance(value, (int, float)) and math.isfinite(value) else None
