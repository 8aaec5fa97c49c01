"""Decisions and the figures shown for them (pipeline.accuracy.taskstats: top-1, binary, multi-label; issue 29).

Each test feeds FP32 and variant outputs through the Comparison the build and ``verify`` use and checks
the verdict, the figure the report shows (value, bounds, unit, the failure line) and the report's accuracy
columns against numbers worked out here from how the data was built, not by re-running taskstats:

* a class masked with ``-inf`` in both FP32 and the variant is never their top-1 decision, so a variant
  that moves 10% of decisions among the other classes fails, and the report's accuracy is right;
* outputs that FP32 and the variant both saturate to ``±inf`` alike are the same output, so they pass
  (infinities are clipped to ±1e30, not to the float64 maximum where norms overflow);
* a multi-label variant's flip rate and label-accuracy drop, with their normal-approximation bounds of the
  per-sample mean, in points.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from pipeline.accuracy.compare import new_comparison
from pipeline.accuracy.judging import VariantResult
from pipeline.accuracy.outputkinds import OutputKind
from tests.judged import INT8, judge


def row(result: VariantResult, metric: str) -> dict:
    [found] = [r for r in result.rows if r["metric"] == metric]
    return found


def test_a_class_masked_with_minus_inf_is_never_the_top1_decision() -> None:
    """Class 0 masked with -inf (e.g. a forbidden token) in FP32 and the variant alike: no NaN/Inf failure, and
    the decisions are among classes 1..9. The variant moves 100 of 1000 decisions to another unmasked class."""
    rng = np.random.default_rng(101)
    n, k = 1000, 10
    ref_pred = rng.integers(1, k, n)
    out_pred = ref_pred.copy()
    out_pred[:100] = ref_pred[:100] % (k - 1) + 1  # another class in 1..9
    assert (out_pred[:100] != ref_pred[:100]).all() and (out_pred >= 1).all()

    def logits(pred: np.ndarray) -> np.ndarray:
        x = rng.normal(size=(n, k)).astype(np.float32)
        x[np.arange(n), pred] = 10.0
        x[:, 0] = -np.inf
        return x

    ref, out = logits(ref_pred), logits(out_pred)
    kind = OutputKind("logits", "classes", "test", classes=k)

    unlabelled = judge(kind, ref, out)
    assert unlabelled.failures == [f"output 'logits' (classes): top-1 disagreement 10.00 points [{row(unlabelled, 'top-1 disagreement')['low']:.2f}, "
                                   f"{row(unlabelled, 'top-1 disagreement')['high']:.2f}] (95% bounds, 1000 samples) > 1 allowed"]
    assert row(unlabelled, "top-1 disagreement")["value"] == pytest.approx(10.0)
    assert unlabelled.comparison["outputs"]["logits"]["agreement"] == pytest.approx(0.9)

    labelled = judge(kind, ref, out, ref_pred)  # FP32 right everywhere, the variant wrong on 100
    assert not labelled.passed and row(labelled, "accuracy drop (top-1)")["value"] == pytest.approx(10.0)
    shown = labelled.comparison["outputs"]["logits"]
    assert (shown["accuracy"], shown["reference_accuracy"]) == (pytest.approx(0.9), 1.0)


def test_an_embedding_both_saturate_to_inf_alike_passes_as_the_same_output() -> None:
    """FP32 and the variant give the same vectors, both +inf (then -inf) in one dimension on 10% of samples:
    every cosine is 1 (the clipped vector points along that dimension in both). Clipping to the float64
    maximum instead overflows the norm to inf, zeroes those vectors, and the mean cosine drops to 0.9."""
    rng = np.random.default_rng(102)
    vectors = rng.normal(size=(500, 16)).astype(np.float32)
    kind = OutputKind("emb", "embedding", "test")
    for inf in (np.inf, -np.inf):
        saturated = vectors.copy()
        saturated[:50, 3] = inf
        result = judge(kind, saturated, saturated.copy())
        assert result.passed, result.failures + result.undecided
        assert row(result, "mean cosine to FP32")["value"] == pytest.approx(1.0)
        assert result.comparison["outputs"]["emb"]["agreement"] == pytest.approx(1.0)


def away_from_half(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Probabilities at least 0.05 from the 0.5 threshold, so that 1 - p is always the other decision."""
    return np.where(rng.random(shape) < 0.5, rng.uniform(0.05, 0.45, shape), rng.uniform(0.55, 0.95, shape)).astype(np.float32)


def mean_and_bounds_in_points(counts: dict[float, int], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of per-sample values given as {value: how many samples}, with one-sided normal bounds (sample std), in points."""
    n = sum(counts.values())
    mean = sum(v * c for v, c in counts.items()) / n
    std = math.sqrt(sum(c * (v - mean) ** 2 for v, c in counts.items()) / (n - 1))
    half = NormalDist().inv_cdf(confidence) * std / math.sqrt(n)
    return mean * 100, (mean - half) * 100, (mean + half) * 100


def test_multilabel_flips_and_label_accuracy_drop_are_shown_in_points_with_their_bounds() -> None:
    """600 samples, 5 labels. The variant flips label 0 on samples 0..119 (one of five decisions: 0.2 each) and
    label 4 on samples 550..599. The labels follow FP32 except label 4 on samples 500..599, where FP32 is wrong,
    so the variant is worse on 120 samples and better on 50."""
    rng = np.random.default_rng(103)
    n = 600
    ref = away_from_half(rng, (n, 5))
    out = ref.copy()
    out[:120, 0] = 1 - out[:120, 0]
    out[550:, 4] = 1 - out[550:, 4]
    truth = (ref > 0.5).astype(np.int64)
    truth[500:, 4] = 1 - truth[500:, 4]
    kind = OutputKind("tags", "multilabel", "test", classes=5)

    unlabelled = judge(kind, ref, out)
    value, low, high = mean_and_bounds_in_points({0.2: 170, 0.0: 430})  # 34/600: 5.67 points
    flipped = row(unlabelled, "label decisions flipped")
    assert (flipped["value"], flipped["low"], flipped["high"], flipped["unit"]) == (pytest.approx(value), pytest.approx(low), pytest.approx(high), "points")
    assert unlabelled.failures == [f"output 'tags' (multilabel): label decisions flipped {value:.2f} points [{low:.2f}, {high:.2f}] "
                                   "(95% bounds, 600 samples) > 1 allowed"]
    shown = unlabelled.comparison["outputs"]["tags"]
    assert (shown["accuracy"], shown["reference_accuracy"], shown["agreement"]) == (None, None, pytest.approx(1 - 34 / 600))

    labelled = judge(kind, ref, out, truth)
    value, low, high = mean_and_bounds_in_points({0.2: 120, -0.2: 50, 0.0: 430})  # 14/600: 2.33 points
    drop = row(labelled, "label accuracy drop")
    assert (drop["value"], drop["low"], drop["high"], drop["unit"]) == (pytest.approx(value), pytest.approx(low), pytest.approx(high), "points")
    assert labelled.failures == [f"output 'tags' (multilabel): label accuracy drop {value:.2f} points [{low:.2f}, {high:.2f}] "
                                 "(95% bounds, 600 samples) > 1 allowed"]
    shown = labelled.comparison["outputs"]["tags"]
    # per-sample label accuracy: FP32 1.0 on 0..499 and 0.8 on 500..599; the variant 0.8 on 0..119, 1.0 on 120..499,
    # 0.8 on 500..549 and 1.0 on 550..599
    assert shown["reference_accuracy"] == pytest.approx((500 + 100 * 0.8) / n)
    assert shown["accuracy"] == pytest.approx((120 * 0.8 + 380 + 50 * 0.8 + 50) / n)
    assert shown["agreement"] == pytest.approx(1 - 34 / 600)


def test_a_multilabel_output_no_batch_reached_shows_no_numbers() -> None:
    """Before any batch, the table's numbers of a declared multi-label output are empty, not an error."""
    comparison = new_comparison("int8-onnx", {"tags": OutputKind("tags", "multilabel", "test", classes=5)}, INT8.threshold)
    assert comparison.summary("tags") == {"accuracy": None, "reference_accuracy": None, "agreement": None}
