"""Measurement windows and the stability rule (perf_analyzer's).

A window is a stretch of wall time; what the generator recorded during it is a range of
positions in the recorders' arrays. A load point is *stable* when, over the last
``count`` windows, each window's throughput and each window's average latency lies within
``threshold`` of that metric's mean over those windows (perf_analyzer: 3 windows, 10%).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.loadtest.recorder import Recorder


@dataclass(frozen=True)
class Mark:
    """Where every recorder stood at one instant (``perf_counter_ns``), and the process CPU time."""

    at_ns: int
    cpu_s: float
    latency_pos: tuple[int, ...]
    lag_pos: tuple[int, ...]
    errors: tuple[int, ...]
    sent: tuple[int, ...]
    dropped: tuple[int, ...] = ()  # connection-level errors so far (Recorder.connection_errors); () where not recorded

    @classmethod
    def take(cls, recorders: Sequence[Recorder], at_ns: int, cpu_s: float) -> Mark:
        return cls(
            at_ns,
            cpu_s,
            tuple(len(r.latency_ns) for r in recorders),
            tuple(len(r.lag_ns) for r in recorders),
            tuple(r.error_count for r in recorders),
            tuple(r.sent for r in recorders),
            tuple(r.connection_errors for r in recorders),
        )


@dataclass(frozen=True)
class Window:
    """What happened between two marks."""

    start: Mark
    end: Mark

    @property
    def seconds(self) -> float:
        return (self.end.at_ns - self.start.at_ns) / 1e9

    @property
    def successes(self) -> int:
        return sum(e - s for s, e in zip(self.start.latency_pos, self.end.latency_pos))

    @property
    def errors(self) -> int:
        return sum(e - s for s, e in zip(self.start.errors, self.end.errors))

    @property
    def dropped(self) -> int:
        """Requests and connects of this window that failed with their connection (the server went away)."""
        return sum(e - s for s, e in zip(self.start.dropped, self.end.dropped))

    @property
    def throughput(self) -> float:
        """Successful requests per second."""
        return self.successes / self.seconds if self.seconds > 0 else 0.0

    def latencies_ns(self, recorders: Sequence[Recorder], endpoint: int | None = None) -> np.ndarray:
        """The window's successful latencies (of one endpoint, or of all)."""
        picks = range(len(recorders)) if endpoint is None else [endpoint]
        parts = [
            np.frombuffer(recorders[i].latency_ns, dtype=np.int64)[self.start.latency_pos[i] : self.end.latency_pos[i]]
            for i in picks
        ]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def mean_latency_ns(self, recorders: Sequence[Recorder]) -> float:
        values = self.latencies_ns(recorders)
        return float(values.mean()) if values.size else float("nan")


def spread(values: Sequence[float]) -> float:
    """The largest distance of a value from the values' mean, as a fraction of it (inf unless all are > 0)."""
    if not values or any(not v > 0 for v in values):  # also rejects NaN
        return float("inf")
    mean = sum(values) / len(values)
    return max(abs(v - mean) for v in values) / mean


def within(values: Sequence[float], threshold: float) -> bool:
    """Every value lies within ``threshold`` (a fraction) of the values' mean (and all are > 0)."""
    return spread(values) <= threshold


def is_stable(throughputs: Sequence[float], latencies: Sequence[float], *, count: int = 3, threshold: float = 0.10) -> bool:
    """perf_analyzer's rule over the last ``count`` windows: throughput and latency both within ``threshold``."""
    if len(throughputs) < count or len(latencies) < count:
        return False
    return within(throughputs[-count:], threshold) and within(latencies[-count:], threshold)
