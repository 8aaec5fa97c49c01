"""Triton's own view of a load point: the statistics extension, as deltas over a stretch of time.

``GET /v2/models/<model>/stats`` returns cumulative counters (count and total nanoseconds for
success, fail, queue, compute_input, compute_infer, compute_output, plus inference_count and
execution_count). Two snapshots subtracted give what the server did in between: how long a
request waited in its queue, how long the model computed, and the average batch the scheduler
formed (inference_count / execution_count).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from urllib.parse import quote

from pipeline.loadtest.client import Endpoint, request_json

_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class ServerCounters:
    """Cumulative counters of one model on one server (summed over its versions)."""

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    compute_input_count: int = 0
    compute_input_ns: int = 0
    compute_infer_count: int = 0
    compute_infer_ns: int = 0
    compute_output_count: int = 0
    compute_output_ns: int = 0
    inference_count: int = 0
    execution_count: int = 0

    def __sub__(self, other: ServerCounters) -> ServerCounters:
        return ServerCounters(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def __add__(self, other: ServerCounters) -> ServerCounters:
        return ServerCounters(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def breakdown(self) -> dict[str, float | int]:
        """Per-request averages in microseconds and the average batch size (for the report)."""

        def avg_us(phase: str) -> float:
            count = getattr(self, f"{phase}_count")
            return getattr(self, f"{phase}_ns") / count / 1e3 if count else float("nan")

        return {
            "success_count": self.success_count,
            "fail_count": self.fail_count,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "request_us": avg_us("success"),
            "queue_us": avg_us("queue"),
            "compute_input_us": avg_us("compute_input"),
            "compute_infer_us": avg_us("compute_infer"),
            "compute_output_us": avg_us("compute_output"),
            "avg_batch_size": self.inference_count / self.execution_count if self.execution_count else float("nan"),
        }


def counters_from_json(payload: object, model: str) -> ServerCounters:
    """Sum the counters of every version of ``model`` in a statistics response."""
    total = ServerCounters()
    entries = payload.get("model_stats", []) if isinstance(payload, dict) else []
    for entry in entries:
        if entry.get("name") != model:
            continue
        inference = entry.get("inference_stats", {})
        values: dict[str, int] = {
            "inference_count": int(entry.get("inference_count", 0)),
            "execution_count": int(entry.get("execution_count", 0)),
        }
        for phase in _PHASES:
            values[f"{phase}_count"] = int(inference.get(phase, {}).get("count", 0))
            values[f"{phase}_ns"] = int(inference.get(phase, {}).get("ns", 0))
        total = total + ServerCounters(**values)
    return total


def fetch_counters(endpoint: Endpoint, model: str, timeout: float = 2.0) -> ServerCounters:
    """Read the model's counters now; raises ``OSError`` when the server cannot be asked."""
    status, payload = request_json(endpoint, "GET", f"/v2/models/{quote(model, safe='')}/stats", timeout=timeout)
    if status != 200:
        raise OSError(f"statistics request answered HTTP {status}: {payload}")
    return counters_from_json(payload, model)


def ensemble_steps(endpoint: Endpoint, model: str, timeout: float = 5.0) -> list[str]:
    """The composing models of ``model`` in step order (its config's ``ensemble_scheduling``); [] for a model that is
    not an ensemble or whose config the server does not show."""
    try:
        status, payload = request_json(endpoint, "GET", f"/v2/models/{quote(model, safe='')}/config", timeout=timeout)
    except OSError:
        return []
    if status != 200 or not isinstance(payload, dict):
        return []
    return [str(step.get("model_name")) for step in (payload.get("ensemble_scheduling") or {}).get("step", []) if step.get("model_name")]


def step_counters(endpoints: list[Endpoint], steps: list[str]) -> dict[str, ServerCounters]:
    """Each step model's counters now, summed over ``endpoints``."""
    return {step: sum((fetch_counters(e, step) for e in endpoints), ServerCounters()) for step in steps}
