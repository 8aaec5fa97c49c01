"""Latency statistics: percentiles of what was measured, in milliseconds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class LatencySummary:
    """Count, mean and percentiles (nearest rank: each is a latency that was actually observed)."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def percentile_ms(self, p: int) -> float:
        return float(getattr(self, f"p{p}_ms"))


EMPTY = LatencySummary(0, float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), float("nan"))


def as_ns_array(samples: Sequence[int] | np.ndarray) -> np.ndarray:
    """An int64 numpy view of an ``array('q')`` (no copy) or of any sequence of ints."""
    if isinstance(samples, np.ndarray):
        return samples.astype(np.int64, copy=False)
    try:
        return np.frombuffer(samples, dtype=np.int64)  # type: ignore[call-overload]
    except TypeError:
        return np.asarray(samples, dtype=np.int64)


def summarize_ns(samples: Sequence[int] | np.ndarray) -> LatencySummary:
    """Summarize latencies given in nanoseconds."""
    values = as_ns_array(samples)
    if values.size == 0:
        return EMPTY
    ms = values / 1e6
    # "inverted_cdf" is the nearest-rank definition: the smallest sample with at least p% at or below it.
    p50, p90, p95, p99 = np.percentile(ms, PERCENTILES, method="inverted_cdf")
    return LatencySummary(int(ms.size), float(ms.mean()), float(p50), float(p90), float(p95), float(p99), float(ms.max()))


def concat_ns(parts: Sequence[Sequence[int] | np.ndarray]) -> np.ndarray:
    """Join latency samples of several endpoints or windows."""
    arrays = [as_ns_array(p) for p in parts]
    return np.concatenate(arrays) if arrays else np.empty(0, dtype=np.int64)
