"""A variant that really is worse fails the accuracy gate, and one that is better passes.

End to end through the functions the build's accuracy stage and ``verify`` use (``new_comparison`` →
``Comparison.add`` → ``judge_comparison``), on labels: scoring a loss as a gain (swapping the samples
FP32 gets right and the variant wrong with the reverse) publishes a worse model, and cutting logits at
the probability threshold instead of its logit judges decisions the model never makes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.accuracy.compare import new_comparison
from pipeline.accuracy.gates import Gates, Tolerance, tolerance_for
from pipeline.accuracy.judging import VariantResult, judge_comparison
from pipeline.accuracy.outputkinds import OutputKind

N, K = 1000, 10
REF_WRONG = slice(0, 50)  # FP32 is wrong on these samples
VARIANT_BREAKS = slice(100, 200)  # the worse variant is wrong on these, where FP32 is right


def judge(kind: OutputKind, ref: np.ndarray, out: np.ndarray, target: np.ndarray | None, tolerance: Tolerance) -> VariantResult:
    comparison = new_comparison("int8-onnx", {kind.name: kind}, tolerance.threshold)
    for i in range(0, len(ref), 128):
        comparison.add({kind.name: ref[i : i + 128]}, {kind.name: out[i : i + 128]}, {} if target is None else {kind.name: target[i : i + 128]})
    return judge_comparison("int8-onnx", "int8", "onnx", comparison, tolerance, {kind.name: kind})


def drop_row(result: VariantResult) -> dict:
    [row] = [r for r in result.rows if r["metric"].startswith("accuracy drop")]
    return row


INT8 = tolerance_for("int8", Gates(int8_atol=None))


def one_hot_scores(classes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    scores = rng.random((len(classes), K)).astype(np.float32) * 0.1
    scores[np.arange(len(classes)), classes] = 1.0
    return scores


def test_a_top1_variant_worse_than_fp32_fails_and_a_better_one_passes() -> None:
    rng = np.random.default_rng(11)
    truth = rng.integers(0, K, N)
    ref_pred = truth.copy()
    ref_pred[REF_WRONG] = (truth[REF_WRONG] + 1) % K
    worse_pred, better_pred = ref_pred.copy(), ref_pred.copy()
    worse_pred[VARIANT_BREAKS] = (truth[VARIANT_BREAKS] + 3) % K  # 100 samples FP32 gets right, the variant wrong
    better_pred[REF_WRONG] = truth[REF_WRONG]  # the 50 samples FP32 gets wrong, the variant right
    kind = OutputKind("probs", "classes", "test", classes=K)
    ref = one_hot_scores(ref_pred, rng)

    worse = judge(kind, ref, one_hot_scores(worse_pred, rng), truth, INT8)
    assert not worse.passed and drop_row(worse)["verdict"] == "fail"
    assert drop_row(worse)["value"] == pytest.approx(10.0) and drop_row(worse)["low"] > INT8.max_drop_points
    assert "output 'probs' (classes): accuracy drop (top-1) 10.00 points" in worse.failures[0]

    better = judge(kind, ref, one_hot_scores(better_pred, rng), truth, INT8)
    assert better.passed and drop_row(better)["verdict"] == "pass"
    assert drop_row(better)["value"] == pytest.approx(-5.0) and drop_row(better)["high"] < 0


def binary_probs(decisions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.where(decisions == 1, 0.6 + 0.4 * rng.random(len(decisions)), 0.4 * rng.random(len(decisions))).astype(np.float32)[:, None]


def test_a_binary_variant_worse_than_fp32_fails_and_a_better_one_passes() -> None:
    rng = np.random.default_rng(12)
    truth = rng.integers(0, 2, N)
    ref_pred = truth.copy()
    ref_pred[REF_WRONG] = 1 - truth[REF_WRONG]
    worse_pred, better_pred = ref_pred.copy(), ref_pred.copy()
    worse_pred[VARIANT_BREAKS] = 1 - truth[VARIANT_BREAKS]
    better_pred[REF_WRONG] = truth[REF_WRONG]
    kind = OutputKind("spam", "binary", "test")
    ref = binary_probs(ref_pred, rng)

    worse = judge(kind, ref, binary_probs(worse_pred, rng), truth, INT8)
    assert not worse.passed and drop_row(worse)["value"] == pytest.approx(10.0) and drop_row(worse)["verdict"] == "fail"
    assert "output 'spam' (binary): accuracy drop (decision) 10.00 points" in worse.failures[0]
    better = judge(kind, ref, binary_probs(better_pred, rng), truth, INT8)
    assert better.passed and drop_row(better)["value"] == pytest.approx(-5.0)


# ---- logits are cut at the logit of the threshold -----------------------------------------------------------------

AT_08 = tolerance_for("int8", Gates(int8_atol=None, binary_threshold=0.8))
CUT = math.log(0.8 / 0.2)  # 1.386: a logit above it is a probability above 0.8


@pytest.mark.parametrize("kind", [OutputKind("spam", "binary", "test", logits=True),
                                  OutputKind("tags", "multilabel", "test", logits=True, classes=1)])
def test_logits_are_decided_at_the_logit_of_the_threshold_not_at_the_threshold(kind: OutputKind) -> None:
    """Logits between 0.8 and 1.386 are negative decisions at a 0.8 threshold (probabilities 0.69 to 0.8)."""
    rng = np.random.default_rng(13)
    ref = np.concatenate([rng.uniform(0.9, 1.3, N // 2), rng.uniform(1.6, 3.0, N // 2)]).astype(np.float32)[:, None]
    # below the cut before and after, but across the probability threshold 0.8: no decision changes
    moved_below = ref.copy()
    moved_below[: N // 2] = rng.uniform(0.3, 0.7, (N // 2, 1))
    assert judge(kind, ref, moved_below, None, AT_08).passed
    # from above the cut to just below it (still above 0.8): half of the decisions change
    crossed = ref.copy()
    crossed[N // 2 :] = rng.uniform(0.95, 1.3, (N // 2, 1))
    result = judge(kind, ref, crossed, None, AT_08)
    assert not result.passed and result.rows[0]["value"] == pytest.approx(50.0)
    assert ref[N // 2 :].min() > CUT > crossed[N // 2 :].max() > 0.8


def test_probabilities_are_decided_at_the_threshold_itself() -> None:
    rng = np.random.default_rng(14)
    kind = OutputKind("spam", "binary", "test")
    ref = rng.uniform(0.81, 0.99, (N, 1)).astype(np.float32)
    assert judge(kind, ref, ref - 0.005, None, AT_08).passed
    result = judge(kind, ref, rng.uniform(0.7, 0.79, (N, 1)).astype(np.float32), None, AT_08)
    assert not result.passed and result.rows[0]["value"] == pytest.approx(100.0)


@pytest.mark.parametrize("kind", [OutputKind("spam", "binary", "test"), OutputKind("tags", "multilabel", "test", classes=1)])
def test_a_probability_exactly_at_the_threshold_is_not_a_positive_decision(kind: OutputKind) -> None:
    """Positive means above the threshold: FP32 at 0.4 and the variant at exactly 0.5 make the same (negative) decision."""
    ref = np.full((N, 1), 0.4, np.float32)
    assert judge(kind, ref, np.full((N, 1), 0.5, np.float32), None, INT8).passed
    assert not judge(kind, ref, np.full((N, 1), 0.5001, np.float32), None, INT8).passed


def test_binary_labels_shaped_like_the_output_count_as_one_per_sample() -> None:
    rng = np.random.default_rng(15)
    truth = rng.integers(0, 2, N)
    ref = binary_probs(truth, rng)
    out = binary_probs(np.where(np.arange(N) < 100, 1 - truth, truth), rng)
    kind = OutputKind("spam", "binary", "test")
    flat, column = judge(kind, ref, out, truth, INT8), judge(kind, ref, out, truth[:, None], INT8)
    assert drop_row(flat) == drop_row(column) and drop_row(column)["value"] == pytest.approx(10.0)


def test_a_labelled_top1_gate_on_too_few_samples_names_what_a_perfect_result_needs() -> None:
    rng = np.random.default_rng(16)
    truth = rng.integers(0, K, 40)
    scores = one_hot_scores(truth, rng)
    result = judge(OutputKind("probs", "classes", "test", classes=K), scores, scores, truth, INT8)
    assert result.undecided == ["not enough evaluation data to judge a 1-point limit: output 'probs' (classes): accuracy drop (top-1) 0.00 points "
                                f"[{drop_row(result)['low']:.2f}, {drop_row(result)['high']:.2f}] (95% bounds, 40 samples); "
                                "even a perfect result needs ≥ 268 samples"]


def test_the_accuracy_summary_of_decisions() -> None:
    """The table's accuracy columns: none without labels; with one labelled sample, that sample's verdicts."""
    from pipeline.accuracy.taskstats import task_stats_for

    kind = OutputKind("probs", "classes", "test", classes=3)
    unlabelled = task_stats_for(kind, 0.5)
    unlabelled.add(np.eye(3, dtype=np.float32), np.eye(3, dtype=np.float32)[[0, 2, 1]], None)
    assert unlabelled.summary() == {"accuracy": None, "reference_accuracy": None, "agreement": pytest.approx(1 / 3)}
    one = task_stats_for(kind, 0.5)
    one.add(np.eye(3, dtype=np.float32)[:1], np.eye(3, dtype=np.float32)[1:2], np.array([0]))
    assert one.summary() == {"accuracy": 0.0, "reference_accuracy": 1.0, "agreement": 0.0}
