"""The results of a load test: per load point, aggregated and per endpoint."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pipeline.loadtest.stats import LatencySummary


@dataclass
class EndpointResult:
    """One endpoint's share of a load point (``endpoint == "all"`` for the aggregate)."""

    endpoint: str
    requests: int  # successful requests in the measured windows
    seconds: float  # length of the measured windows
    batch_size: int
    latency: LatencySummary  # ms, from send (closed loop) or scheduled time (open loop)
    send_lag: LatencySummary | None  # open loop: how late requests left after their scheduled time
    errors: dict[str, int]  # whole point (warm-up included), by kind
    error_samples: dict[str, list[str]]
    server: dict[str, float | int] | None  # Triton statistics over the measured windows (deltas)
    server_note: str = ""  # why ``server`` is missing, if it is
    client_successes_total: int = 0  # whole point, warm-up included
    server_successes_total: int | None = None  # Triton's success count over the whole point
    unsent: int = 0  # open loop: scheduled requests that never went out before the point ended
    abandoned: int = 0  # in flight when the point ended, after the drain period (not counted as errors)
    metrics: dict[str, Any] | None = None  # Triton's Prometheus metrics over the whole point (counter deltas, end gauges)
    metrics_note: str = ""  # why ``metrics`` is missing, if it is

    @property
    def throughput_rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def infer_per_s(self) -> float:
        return self.throughput_rps * self.batch_size

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["throughput_rps"] = self.throughput_rps
        out["infer_per_s"] = self.infer_per_s
        out["error_count"] = self.error_count
        return _finite(out)


@dataclass
class PointResult:
    """One load point of one model: the aggregate over endpoints, and each endpoint."""

    model: str
    protocol: str
    encoding: str
    policy: str  # "concurrency" | "request_rate"
    load: float  # the concurrency or the request rate (per endpoint)
    arrivals: str | None
    batch_size: int
    stable: bool
    overloaded: bool  # open loop: completed clearly less than the offered rate (queue growing)
    windows: int  # measurement windows run (warm-up excluded)
    used_windows: int  # the last windows the result is computed from
    wall_seconds: float  # the whole point, warm-up and drain included
    client_cpu_us_per_request: float
    aggregate: EndpointResult
    endpoints: list[EndpointResult] = field(default_factory=list)
    aborted: str | None = None
    incomplete: str | None = None  # load generators (worker processes, shards) whose share is missing, and why
    disrupted: list[str] = field(default_factory=list)  # windows the server went away or restarted in, left out of the statistics
    window_spread: dict[str, float] | None = None  # the used windows' throughput / mean latency: largest deviation from their mean (fraction)
    steps: dict[str, dict[str, float | int]] | None = None  # an ensemble's composing models: Triton's breakdown of each over the point

    @property
    def label(self) -> str:
        if self.policy == "concurrency":
            return f"c={int(self.load)}"
        return f"{self.load:g}/s"

    def meets(self, slo_p99_ms: float) -> bool:
        """No errors, not aborted, and client p99 within the SLO."""
        agg = self.aggregate
        return not self.aborted and agg.error_count == 0 and agg.requests > 0 and agg.latency.p99_ms <= slo_p99_ms

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("aggregate", "endpoints")}
        out["aggregate"] = self.aggregate.to_dict()
        out["endpoints"] = [e.to_dict() for e in self.endpoints]
        return _finite(out)


@dataclass
class RunResult:
    """A whole load test: its points, and any run-level failure (e.g. the server died)."""

    started: str
    settings: dict[str, Any]
    server: dict[str, Any]
    generator: dict[str, Any]
    points: list[PointResult] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped_models: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "settings": self.settings,
            "server": self.server,
            "generator": self.generator,
            "failures": self.failures,
            "skipped_models": self.skipped_models,
            "points": [p.to_dict() for p in self.points],
        }


def _latency(value: dict[str, Any] | None) -> LatencySummary | None:
    if value is None:
        return None
    fields: dict[str, Any] = {k: (float("nan") if v is None else v) for k, v in value.items()}
    return LatencySummary(**fields)


def _endpoint_from_dict(value: dict[str, Any]) -> EndpointResult:
    known = {f.name for f in fields(EndpointResult)}
    out = {k: v for k, v in value.items() if k in known}
    out["latency"] = _latency(value["latency"])
    out["send_lag"] = _latency(value.get("send_lag"))
    return EndpointResult(**out)


def run_from_dict(payload: dict[str, Any]) -> RunResult:
    """A RunResult back from its ``results.json`` (None where the JSON has null for NaN)."""
    known = {f.name for f in fields(PointResult)}
    points = []
    for p in payload.get("points", []):
        point = {k: v for k, v in p.items() if k in known and k not in ("aggregate", "endpoints")}
        if point.get("client_cpu_us_per_request") is None:
            point["client_cpu_us_per_request"] = float("nan")
        points.append(PointResult(**point, aggregate=_endpoint_from_dict(p["aggregate"]), endpoints=[_endpoint_from_dict(e) for e in p["endpoints"]]))
    return RunResult(
        started=payload["started"], settings=payload["settings"], server=payload["server"], generator=payload["generator"],
        points=points, failures=payload.get("failures", []), skipped_models=payload.get("skipped_models", {}),
    )


def unstable_hint(points: list[PointResult], threshold: float, window_s: float, max_s: float) -> str | None:
    """What to change when points ended unstable: which figure varied, by how much, and the options."""
    unstable = [p for p in points if not p.stable and not p.overloaded and not p.aborted and p.window_spread]
    if not unstable:
        return None
    worst = {k: max(p.window_spread[k] for p in unstable) for k in ("throughput", "latency")}  # type: ignore[index]
    varied = " and ".join(f"{k} by up to {v:.0%}" for k, v in worst.items() if v > threshold) or "too few windows"
    return (
        f"{len(unstable)} point(s) not stable within --max-seconds {max_s:g}: their last windows' {varied} "
        f"(allowed: {threshold:.0%}). Longer windows average more requests: --window-ms {window_s * 2000:g} "
        f"--max-seconds {max(max_s * 2, 30):g}; on a busy machine, free it or accept more with --stability-percentage "
        f"{min(99, round(max(worst.values()) * 100 + 5)) if all(map(math.isfinite, worst.values())) else 25}"
    )


def best_point(points: list[PointResult], slo_p99_ms: float) -> PointResult | None:
    """The highest-throughput point meeting the p99 SLO (stable points preferred)."""
    meeting = [p for p in points if p.meets(slo_p99_ms)]
    if not meeting:
        return None
    return max(meeting, key=lambda p: (p.stable, p.aggregate.infer_per_s))


def _finite(value: Any) -> Any:
    """NaN/inf → None, so the JSON is standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
