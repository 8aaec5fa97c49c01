"""Each figure says its interval, and an unstable point says what to change."""

from __future__ import annotations

import math

from pipeline.loadtest.report import metrics_data, points_data
from pipeline.loadtest.results import EndpointResult, PointResult, RunResult, unstable_hint
from pipeline.loadtest.stats import summarize_ns
from pipeline.loadtest.window import spread, within


def point(stable: bool, window_spread: dict[str, float] | None, metrics: dict | None = None) -> PointResult:
    agg = EndpointResult("all", 300, 3.0, 1, summarize_ns([1_000_000] * 300), None, {}, {}, None, metrics=metrics)
    return PointResult("add", "http", "binary", "concurrency", 4, None, 1, stable, False, 10, 3, 12.0, 30.0, agg, [agg],
                       window_spread=window_spread)


def test_spread_is_the_largest_relative_distance_from_the_mean() -> None:
    assert spread([90, 100, 110]) == 0.1 and within([90, 100, 110], 0.1) and not within([89, 100, 111], 0.1)
    assert math.isinf(spread([0, 1])) and math.isinf(spread([]))


def test_an_unstable_point_names_the_figure_that_varied_and_the_options() -> None:
    hint = unstable_hint([point(False, {"throughput": 0.31, "latency": 0.04}), point(True, {"throughput": 0.02, "latency": 0.01})],
                         0.10, 1.0, 30)
    assert hint is not None and hint.startswith("1 point(s) not stable within --max-seconds 30")
    assert "throughput by up to 31%" in hint and "latency" not in hint.split("(allowed")[0]
    assert "--window-ms 2000" in hint and "--max-seconds 60" in hint and "--stability-percentage 36" in hint
    assert unstable_hint([point(True, {"throughput": 0.0, "latency": 0.0})], 0.10, 1.0, 30) is None


def test_the_tables_say_their_intervals() -> None:
    metrics = {"seconds": 10.0, "inferences": 6464, "infer_per_s": 646.4, "executions": 6464, "avg_batch_size": 1.0, "failure": 0,
               "request_us": 100.0, "queue_us": 10.0, "compute_infer_us": 50.0, "gpus": [], "gpu_note": ""}
    result = RunResult("now", {"protocol": "http", "stability": "last 3 windows within 10%"}, {}, {}, [point(True, None, metrics)])
    assert "over each point's last 3 windows" in points_data(result).title
    table = metrics_data(result)
    assert "whole point" in table.title
    row = dict(zip(table.columns, table.rows[0]))
    assert row["seconds"] == "10.0" and row["infer/s"] == "646.4"
