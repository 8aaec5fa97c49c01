"""Latency summaries: nearest-rank percentiles, ordering, empty input."""

from __future__ import annotations

import math
from array import array

import numpy as np

from pipeline.loadtest.stats import concat_ns, summarize_ns


def test_nearest_rank_percentiles_of_1_to_100_ms() -> None:
    samples = array("q", [i * 1_000_000 for i in range(100, 0, -1)])  # 100..1 ms, unsorted
    s = summarize_ns(samples)
    assert s.count == 100
    assert (s.p50_ms, s.p90_ms, s.p95_ms, s.p99_ms, s.max_ms) == (50.0, 90.0, 95.0, 99.0, 100.0)
    assert s.mean_ms == 50.5


def test_percentiles_are_observed_values_and_ordered() -> None:
    rng = np.random.default_rng(1)
    ns = rng.lognormal(13, 1, 5001).astype(np.int64)
    s = summarize_ns(ns)
    observed = set((ns / 1e6).tolist())
    for p in (s.p50_ms, s.p90_ms, s.p95_ms, s.p99_ms, s.max_ms):
        assert p in observed
    assert s.p50_ms <= s.p90_ms <= s.p95_ms <= s.p99_ms <= s.max_ms


def test_single_and_empty_samples() -> None:
    one = summarize_ns([2_500_000])
    assert one.p50_ms == one.p99_ms == one.max_ms == 2.5
    empty = summarize_ns(array("q"))
    assert empty.count == 0 and math.isnan(empty.p99_ms)


def test_concat_of_recorder_arrays() -> None:
    joined = concat_ns([array("q", [1, 2]), array("q", []), np.array([3], dtype=np.int64)])
    assert joined.tolist() == [1, 2, 3]
