"""Triton statistics: parsing, deltas, per-request breakdown."""

from __future__ import annotations

import math

from pipeline.loadtest.server_stats import counters_from_json


def stats_json(success: int, queue_ns: int, inference: int, execution: int, version: str = "1") -> dict:
    phase = lambda count, ns: {"count": count, "ns": ns}
    return {
        "name": "m", "version": version, "inference_count": inference, "execution_count": execution,
        "inference_stats": {
            "success": phase(success, success * 1000), "fail": phase(0, 0), "queue": phase(success, queue_ns),
            "compute_input": phase(execution, execution * 10), "compute_infer": phase(execution, execution * 500),
            "compute_output": phase(execution, execution * 20),
        },
    }  # fmt: skip


def test_delta_and_breakdown() -> None:
    before = counters_from_json({"model_stats": [stats_json(100, 100_000, 100, 100)]}, "m")
    after = counters_from_json({"model_stats": [stats_json(500, 2_100_000, 500, 150)]}, "m")
    b = (after - before).breakdown()
    assert b["success_count"] == 400
    assert b["queue_us"] == 5.0  # 2_000_000 ns over 400 requests
    assert b["request_us"] == 1.0
    assert b["compute_infer_us"] == 0.5
    assert b["avg_batch_size"] == 8.0  # 400 inferences in 50 executions


def test_versions_are_summed_and_other_models_ignored() -> None:
    payload = {"model_stats": [stats_json(10, 0, 10, 10, "1"), stats_json(5, 0, 5, 5, "2"), {**stats_json(99, 0, 99, 99), "name": "x"}]}
    assert counters_from_json(payload, "m").success_count == 15


def test_no_traffic_gives_nan_averages() -> None:
    b = counters_from_json({"model_stats": []}, "m").breakdown()
    assert b["success_count"] == 0 and math.isnan(b["queue_us"]) and math.isnan(b["avg_batch_size"])


def test_a_point_reads_the_servers_counters_once_they_have_settled() -> None:
    """Triton counts a request after sending its response, so the read right after the request check (or the drain)
    may lack the last ones: the point's first and last reads wait until two reads agree, and give up on a server
    whose counts keep moving (someone else's load) instead of waiting for ever."""
    from pipeline.loadtest.measure import _SETTLE_READS, _read_settled
    from pipeline.loadtest.server_stats import ServerCounters

    counts = iter([7564, 7565, 7565, 9999])
    reads: list[int] = []

    def lagging() -> ServerCounters:
        reads.append(next(counts))
        return ServerCounters(success_count=reads[-1])

    notes = [""]
    settled = _read_settled(lagging, notes, 0)
    assert settled is not None and settled.success_count == 7565 and reads == [7564, 7565, 7565]
    moving = iter(range(10_000))
    busy = _read_settled(lambda: ServerCounters(success_count=next(moving)), notes, 0)
    assert busy is not None and busy.success_count == _SETTLE_READS and notes == [""]  # the last read, after the bounded wait

    def gone() -> ServerCounters:
        raise ConnectionRefusedError(111, "Connection refused")

    assert _read_settled(gone, notes, 0) is None and notes[0].startswith("Triton statistics unavailable")
