"""What a judged variant records, row by row: the accuracy report and the served report show these rows and
messages, and the build stops on them. Exact, so a verdict, limit or message that changes shows here.

One comparison holds every case: an output without a kind (first, so the others must still be judged),
a labeled top-1 output at exactly the samples a perfect result needs, FP16's atol on class scores and a
binary output (never on regression values), a NaN, an undecided regression figure and an undecided
decision figure, and an output the comparison measured but the judge was given no kind for.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.accuracy.compare import new_comparison
from pipeline.accuracy.gates import Gates, tolerance_for
from pipeline.accuracy.judging import judge_comparison, judge_figure
from pipeline.accuracy.outputkinds import OutputKind

N = 268  # bounds.min_samples(1.0, 0.95): a perfect top-1 result passes a 1-point limit from here on
FP16 = tolerance_for("fp16", Gates())


def row(output: str, kind: str | None, metric: str, value: object, low: object, high: object, unit: str, limit: object, verdict: str) -> dict:
    return {"output": output, "kind": kind, "metric": metric, "value": value, "low": low, "high": high, "unit": unit, "worse": "higher",
            "limit": limit, "verdict": verdict}


def test_every_row_verdict_and_message_of_one_variant() -> None:
    rng = np.random.default_rng(7)
    truth = rng.integers(0, 10, N)
    probs = np.eye(10, dtype=np.float32)[truth] * 0.9 + 0.01
    out_probs = probs.copy()
    out_probs[5, 3] += 0.02  # no top-1 change, but past FP16's atol of 0.01
    score = rng.normal(size=(N, 1)).astype(np.float32)
    out_score = score.copy()
    out_score[9, 0] += 0.33  # one sample moves: its RMS change cannot be judged against 0.02 on 268 samples
    out_score[10, 0] = np.nan
    flag = rng.random((N, 1)).astype(np.float32)
    out_flag = flag.copy()
    out_flag[:2] = 1 - out_flag[:2]  # 2 decisions flip (and move by 0.6)
    extra = rng.random((N, 2)).astype(np.float32)
    kinds = {"probs": OutputKind("probs", "classes", "t", classes=10), "score": OutputKind("score", "regression", "t"),
             "flag": OutputKind("flag", "binary", "t"), "orphan": OutputKind("orphan", "regression", "t")}
    comparison = new_comparison("fp16-onnx", kinds, FP16.threshold)
    ref = {"extra": extra, "probs": probs, "score": score, "flag": flag, "orphan": extra}
    comparison.add(ref, {**ref, "probs": out_probs, "score": out_score, "flag": out_flag}, {"probs": truth})
    judged = {k: v for k, v in kinds.items() if k != "orphan"}

    result = judge_comparison("fp16-onnx", "fp16", "onnx", comparison, FP16, judged)

    assert (result.variant, result.precision, result.kind, result.tolerance) == ("fp16-onnx", "fp16", "onnx", FP16)
    assert result.comparison == comparison.as_dict() and not result.passed
    a = pytest.approx
    assert result.rows == [
        row("extra", None, "output kind", None, None, None, "", None, "fail"),
        row("probs", "classes", "accuracy drop (top-1)", 0.0, a(-0.99944, abs=1e-5), a(0.99944, abs=1e-5), "points", 1.0, "pass"),
        row("probs", "classes", "max abs error", a(0.02), a(0.02), a(0.02), "", 0.01, "fail"),
        row("score", "regression", "non-finite values", 1, 1, 1, "", 0, "fail"),
        row("score", "regression", "RMS change / FP32 std", a(0.05591, abs=1e-5), 0.0, a(0.08701, abs=1e-5), "", 0.02, "undecided"),
        row("flag", "binary", "decision disagreement", a(200 / 268), a(0.24727, abs=1e-5), a(2.22980, abs=1e-5), "points", 1.0, "undecided"),
        row("flag", "binary", "max abs error", a(0.60359, abs=1e-5), a(0.60359, abs=1e-5), a(0.60359, abs=1e-5), "", 0.01, "fail"),
        row("orphan", None, "output kind", None, None, None, "", None, "fail"),
    ]
    assert result.failures == [
        "output 'extra' has no kind, so no gate judges it (known: flag, probs, score)",
        "output 'probs' (classes): max abs error 0.02 > 0.01 allowed",
        "output 'score' (regression): 1 NaN/Inf values in 1 samples where FP32 has finite ones",
        "output 'flag' (binary): max abs error 0.6036 > 0.01 allowed",
        "output 'orphan' has no kind, so no gate judges it (known: flag, probs, score)",
    ]
    assert result.undecided == [  # 268 samples: no "even a perfect result needs" for the 1-point limit, none for a ratio; what would decide
        "not enough evaluation data to judge a limit of 0.02: output 'score' (regression): RMS change / FP32 std 0.05591 [0, 0.08701] "
        "(95% bounds, 268 samples); at this RMS change / FP32 std, about 650 samples would decide it",
        "not enough evaluation data to judge a 1-point limit: output 'flag' (binary): decision disagreement 0.75 points [0.25, 2.23] "
        "(95% bounds, 268 samples); at this decision disagreement, about 9,162 samples would decide it",
    ]


def test_no_kinds_at_all_is_named() -> None:
    comparison = new_comparison("int8-onnx", {}, 0.5)
    comparison.add({"y": np.ones((4, 2), np.float32)}, {"y": np.ones((4, 2), np.float32)}, {})
    result = judge_comparison("int8-onnx", "int8", "onnx", comparison, tolerance_for("int8", Gates()), {})
    assert result.failures == ["output 'y' has no kind, so no gate judges it (known: none)"]


def test_a_figure_exactly_at_its_limit_passes() -> None:
    """``high ≤ limit`` passes (higher is worse), ``low ≥ limit`` passes (lower is worse): the documented rule."""
    assert judge_figure("y", "classes", "accuracy drop (top-1)", 0.5, 0.0, 1.0, "points", "higher", 1.0, 500, 0.95) == ("pass", "")
    assert judge_figure("e", "embedding", "mean cosine to FP32", 0.995, 0.99, 0.999, "", "lower", 0.99, 500, 0.95) == ("pass", "")
    verdict, why = judge_figure("y", "classes", "accuracy drop (top-1)", 2.0, 1.0, 3.0, "points", "higher", 1.0, 500, 0.95)
    assert verdict == "undecided" and why == ("not enough evaluation data to judge a 1-point limit: output 'y' (classes): accuracy drop (top-1) "
                                              "2.00 points [1.00, 3.00] (95% bounds, 500 samples)")  # a bound on the limit: no estimate


def test_an_undecided_figure_says_about_how_many_samples_would_decide_it() -> None:
    """Bounds narrow as 1/√n: a 0.33-point disagreement [0.07, 1.48] on 300 samples needs about 300·(1.15/0.67)² to pass
    its 1-point limit, and a 1.5-point drop [0.5, 2.5] about 500·(1.0/0.5)² to fail it."""
    from pipeline.accuracy.judging import samples_to_decide

    assert samples_to_decide(0.33, 1.48, 1.0, 300) == 884
    assert samples_to_decide(1.5, 0.5, 1.0, 500) == 2000
    assert samples_to_decide(1.0, 0.5, 1.0, 500) is None and samples_to_decide(0.5, 1.0, 1.0, 500) is None
    verdict, why = judge_figure("y", "classes", "top-1 disagreement", 0.33, 0.07, 1.48, "points", "higher", 1.0, 300, 0.95)
    assert verdict == "undecided" and why.endswith("; at this top-1 disagreement, about 884 samples would decide it"), why
