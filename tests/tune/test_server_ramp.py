"""The Server-scenario ramp of ``tune --scenario server`` (pipeline/tune/server_ramp.py) on given verdicts: the
doubling, the break run twice, the bisection, and the score (the highest VALID target QPS). The LoadGen runs behind
each point are real in tests/tune/test_tune_e2e.py; here each point's verdict is given, so the search is exact."""

from __future__ import annotations

from typing import Any

from pipeline.tune.server_ramp import BISECTIONS, ServerRamp, ramp_points
from pipeline.tune.space import Candidate
from pipeline.tune.trial import Trial, TrialSettings

RAMP = TrialSettings(slo_p99_ms=10, open_loop=True, start=50, max_load=50 * 64, fixed_load=50, scenario="server").server_ramp()


def scored(points: list[dict[str, Any]]) -> Trial:
    return Trial(Candidate(1, 64, (), 0), points, slo_p99_ms=10, load_kind="target_qps", fixed_load=50)


def verdicts(valid_up_to: float, flaky: set[float] = frozenset()) -> tuple[Any, list[float]]:  # type: ignore[assignment]
    """Points VALID up to ``valid_up_to`` QPS; a target in ``flaky`` is INVALID the first time it runs."""
    asked: list[float] = []

    def measure(qps: float) -> dict[str, Any]:
        first = qps not in asked
        asked.append(qps)
        valid = qps <= valid_up_to and not (first and qps in flaky)
        return {"load": qps, "infer_per_s": qps * 0.99, "p50_ms": 1.0, "p99_ms": 5.0 if valid else 50.0, "errors": 0, "stable": True,
                "overloaded": False, "avg_batch": None, "queue_us": None, "aborted": None, "meets_slo": valid,
                "result": "VALID" if valid else "INVALID", "reasons": [] if valid else ["the latency bound was not met"]}

    return measure, asked


def test_the_ramp_doubles_until_invalid_twice_then_bisects_to_the_highest_valid_target() -> None:
    measure, asked = verdicts(valid_up_to=1000)
    assert RAMP == ServerRamp(slo_p99_ms=10, start=50, max_load=3200)
    trial = scored(ramp_points(RAMP, measure))
    assert asked == [50, 100, 200, 400, 800, 1600, 1600, 1200, 1000, 1100]  # 3 bisections between 800 and 1600
    assert len(asked) - 7 == BISECTIONS
    assert [p["load"] for p in trial.points] == [50, 100, 200, 400, 800, 1600, 1200, 1000, 1100]  # the break is one point, retried
    assert trial.points[5]["retried"] and not trial.points[5]["meets_slo"]
    assert trial.meets_slo and trial.score == 1000 and trial.best_point["load"] == 1000  # type: ignore[index]
    assert trial.to_dict()["load"] == {"target_qps": 1000} and trial.to_dict()["infer_per_s"] == 990


def test_a_break_that_does_not_repeat_is_a_stall_and_the_ramp_goes_on() -> None:
    measure, asked = verdicts(valid_up_to=1000, flaky={400})
    trial = scored(ramp_points(RAMP, measure))
    assert asked[:6] == [50, 100, 200, 400, 400, 800] and trial.points[3] | {"retried": True} == trial.points[3]
    assert trial.points[3]["meets_slo"] and trial.score == 1000


def test_nothing_valid_scores_below_zero_and_everything_valid_stops_at_max_load() -> None:
    measure, asked = verdicts(valid_up_to=10)
    none = scored(ramp_points(RAMP, measure))
    assert asked == [50, 50] and len(none.points) == 1  # the first target broke twice: nothing to bisect
    assert not none.meets_slo and none.score == -50.0
    measure, asked = verdicts(valid_up_to=1e9)
    every = scored(ramp_points(RAMP, measure))
    assert asked == [50, 100, 200, 400, 800, 1600, 3200] and every.score == 3200


def test_the_progress_line_and_the_table_speak_loadgens_terms() -> None:
    from rich.console import Console

    from pipeline.tune.results import progress_line, table
    from tests.tune.helpers import model_tune

    measure, _ = verdicts(valid_up_to=1000)
    good = scored(ramp_points(RAMP, measure))
    good.baseline = True
    measure, _ = verdicts(valid_up_to=10)
    bad = scored(ramp_points(RAMP, measure))
    bad.points[0]["reasons"] = ["early stopping could not confirm the percentile with this many queries (Run unsuccessful.)"]
    job = model_tune("digits_fp32", [good, bad])
    assert "990 infer/s at target_qps 1000" in progress_line(job, good, 1, 2)
    assert "no target QPS is VALID[/] (at 50: p99 50.0 ms, early stopping could not confirm the percentile with this many queries)" in \
        progress_line(job, bad, 2, 2)
    console = Console(width=250, record=True)
    console.print(table([job], 10))
    text = console.export_text()
    assert "highest VALID MLPerf Server target QPS, latency bound 10 ms" in text and "VALID QPS" in text and "samples/s" in text
