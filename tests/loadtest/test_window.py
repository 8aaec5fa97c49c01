"""Measurement windows and perf_analyzer's stability rule."""

from __future__ import annotations

from pipeline.loadtest.recorder import Recorder
from pipeline.loadtest.window import Mark, Window, is_stable, within


def test_within_threshold_of_mean() -> None:
    assert within([100, 105, 95], 0.10)
    assert not within([100, 100, 125], 0.10)  # mean 108.3; 125 is 15% above
    assert not within([0, 0, 0], 0.10)  # nothing measured is not stable
    assert not within([100, float("nan"), 100], 0.10)


def test_stable_needs_three_windows_and_both_metrics() -> None:
    assert not is_stable([100, 100], [1.0, 1.0])
    assert is_stable([50, 100, 101, 99], [9.0, 1.0, 1.02, 0.99])  # only the last 3 count
    assert not is_stable([100, 101, 99], [1.0, 1.0, 1.5])  # throughput steady, latency not
    assert not is_stable([100, 130, 99], [1.0, 1.0, 1.0])
    assert is_stable([100, 112, 100], [1.0, 1.0, 1.0], threshold=0.10)  # 112 is 7.7% above the mean 104
    assert not is_stable([100, 112, 100], [1.0, 1.0, 1.0], threshold=0.05)


def test_window_slices_recorders() -> None:
    a, b = Recorder(), Recorder()
    a.latency_ns.extend([10, 20])
    start = Mark.take([a, b], 0, 0.0)
    a.latency_ns.extend([30, 40, 50])
    b.latency_ns.extend([60])
    b.error("http_500")
    end = Mark.take([a, b], 2_000_000_000, 0.5)
    w = Window(start, end)
    assert w.successes == 4 and w.errors == 1
    assert w.throughput == 2.0
    assert w.latencies_ns([a, b]).tolist() == [30, 40, 50, 60]
    assert w.latencies_ns([a, b], endpoint=1).tolist() == [60]
    assert w.mean_latency_ns([a, b]) == 45.0
