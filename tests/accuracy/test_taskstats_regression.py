"""Regression and segmentation outputs: the figures they are judged on (pipeline.accuracy.taskstats; issue 29).

Each test builds FP32 outputs, variant outputs and labels with a known relation, feeds them batch by batch
(as the build and ``verify`` do) and checks the figure, its bounds and the report's accuracy columns against
numbers worked out here from the arrays, not by re-running taskstats:

* regression: the R² drop in points (per-sample squared-error gain over the target's variance, with
  normal bounds of the per-sample mean), judged with targets; the RMS change over the FP32 output's
  standard deviation, judged without targets and reported beside the R² drop with them;
* segmentation: the mIoU drop (IoU per class over the whole set, averaged over the classes present), with
  paired bootstrap bounds over samples; without labels, the rate of positions that change class.
"""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist

import numpy as np
import pytest

from pipeline.accuracy.judging import VariantResult
from pipeline.accuracy.outputkinds import OutputKind
from pipeline.accuracy.taskstats import BOOTSTRAP_DRAWS, Figure, RegressionStats, SegmentationStats, task_stats_for
from tests.judged import INT8, judge

REG = OutputKind("depth", "regression", "test")
SEG = OutputKind("mask", "segmentation", "test", classes=4)


def feed(stats: RegressionStats | SegmentationStats, ref: np.ndarray, out: np.ndarray, target: np.ndarray | None = None,
         batch: int = 100) -> RegressionStats | SegmentationStats:
    for i in range(0, len(ref), batch):
        stats.add(ref[i : i + batch], out[i : i + batch], None if target is None else target[i : i + batch])
    return stats


def verdicts(result: VariantResult) -> dict[str, str]:
    return {row["metric"]: row["verdict"] for row in result.rows}


def normal_bounds(per_sample: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """Mean of per-sample values ± z·s/√n (one-sided bounds, each at ``confidence``)."""
    mean = float(per_sample.mean())
    half = NormalDist().inv_cdf(confidence) * float(per_sample.std(ddof=1)) / math.sqrt(len(per_sample))
    return mean, mean - half, mean + half


# ---- regression ----------------------------------------------------------------------------------------------------


def regression_set(rng: np.random.Generator, n: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Targets of 3 values per sample on different scales and offsets, and an FP32 model off by N(0, 0.3)."""
    target = (rng.normal(size=(n, 3)) * [1.0, 2.0, 0.5] + [0.0, 5.0, -1.0]).astype(np.float32)
    ref = (target + rng.normal(scale=0.3, size=target.shape)).astype(np.float32)
    return target, ref


def r2_drop(ref: np.ndarray, out: np.ndarray, target: np.ndarray, confidence: float) -> tuple[float, float, float]:
    t = target.astype(np.float64)
    gain = ((out.astype(np.float64) - t) ** 2).mean(axis=1) - ((ref.astype(np.float64) - t) ** 2).mean(axis=1)
    return tuple(x / t.var() * 100 for x in normal_bounds(gain, confidence))  # type: ignore[return-value]


def rms_change(ref: np.ndarray, out: np.ndarray, confidence: float, std: float | None = None) -> tuple[float, float, float]:
    r = ref.astype(np.float64).reshape(len(ref), -1)
    change = ((out.astype(np.float64).reshape(len(out), -1) - r) ** 2).mean(axis=1)
    std = float(r.std()) if std is None else std
    return tuple(math.sqrt(max(x, 0.0)) / std for x in normal_bounds(change, confidence))  # type: ignore[return-value]


def test_a_variant_whose_r2_really_drops_7_points_fails_and_a_better_one_passes() -> None:
    """The R² drop is FP32's R² minus the variant's: a variant with extra N(0, 0.8) error loses about 7 points of R²
    (positive, bounds around it, the gate fails); one closer to the targets than FP32 has a negative drop and passes."""
    rng = np.random.default_rng(2901)
    target, ref = regression_set(rng)
    worse = (ref + rng.normal(scale=0.8, size=ref.shape)).astype(np.float32)
    better = (target + rng.normal(scale=0.1, size=ref.shape)).astype(np.float32)

    r2, change = feed(RegressionStats(REG, INT8.threshold), ref, worse, target).figures(0.95)
    expected = r2_drop(ref, worse, target, 0.95)
    assert (r2.value, r2.low, r2.high) == pytest.approx(expected, rel=1e-9)
    assert 1 < r2.low < r2.value < r2.high and 5 < r2.value < 10
    assert r2 == Figure("R² drop", r2.value, r2.low, r2.high, "points", "higher", "max_drop_points")  # gated, not one decision per sample
    result = judge(REG, ref, worse, target)
    assert not result.passed and result.failures[0].startswith("output 'depth' (regression): R² drop 7.")
    assert verdicts(result) == {"R² drop": "fail", "RMS change / FP32 std": "reported"}

    r2, _ = feed(RegressionStats(REG, INT8.threshold), ref, better, target).figures(0.95)
    assert (r2.value, r2.low, r2.high) == pytest.approx(r2_drop(ref, better, target, 0.95), rel=1e-9)
    assert r2.low < r2.value < r2.high < 0
    assert judge(REG, ref, better, target).passed


def test_r2_bounds_widen_with_the_confidence_asked() -> None:
    """The bounds are at the confidence the gate asks: 99% bounds lie outside 80% bounds, around the same value."""
    rng = np.random.default_rng(2902)
    target, ref = regression_set(rng, 400)
    out = (ref + rng.normal(scale=0.2, size=ref.shape)).astype(np.float32)
    stats = feed(RegressionStats(REG, INT8.threshold), ref, out, target, batch=64)
    for confidence in (0.8, 0.99):
        r2, _ = stats.figures(confidence)
        assert (r2.value, r2.low, r2.high) == pytest.approx(r2_drop(ref, out, target, confidence), rel=1e-9)


def test_the_report_shows_r2_of_the_variant_and_of_fp32() -> None:
    """The accuracy columns of a regression output are R² = 1 − MSE / variance of the targets, for the variant and FP32,
    over every batch (and for a single labelled sample); without targets there is no R² to show."""
    rng = np.random.default_rng(2903)
    target, ref = regression_set(rng, 500)
    out = (ref + rng.normal(scale=0.5, size=ref.shape)).astype(np.float32)

    def r2(pred: np.ndarray, t: np.ndarray) -> float:
        return 1 - float(((pred.astype(np.float64) - t) ** 2).mean()) / float(t.astype(np.float64).var())

    summary = feed(RegressionStats(REG, INT8.threshold), ref, out, target, batch=128).summary()
    assert summary == pytest.approx({"accuracy": r2(out, target), "reference_accuracy": r2(ref, target)}, rel=1e-9)
    assert 0.8 < summary["reference_accuracy"] < 1 and summary["accuracy"] < summary["reference_accuracy"]  # type: ignore[operator]
    one = feed(RegressionStats(REG, INT8.threshold), ref[:1], out[:1], target[:1]).summary()
    assert one == pytest.approx({"accuracy": r2(out[:1], target[:1]), "reference_accuracy": r2(ref[:1], target[:1])}, rel=1e-9)
    assert feed(RegressionStats(REG, INT8.threshold), ref, out).summary() == {}


def test_without_targets_the_rms_change_over_the_fp32_spread_is_judged_and_with_them_only_reported() -> None:
    """Without targets the gated figure is the RMS change divided by the FP32 output's standard deviation (a 1% change
    is 0.01 whatever the output's units); with targets the same figure is shown beside the R² drop, not judged."""
    rng = np.random.default_rng(2904)
    target, ref = regression_set(rng, 600)
    out = (ref * 1.01 + rng.normal(scale=0.02, size=ref.shape)).astype(np.float32)

    [change] = feed(RegressionStats(REG, INT8.threshold), ref, out).figures(0.95)
    assert (change.value, change.low, change.high) == pytest.approx(rms_change(ref, out, 0.95), rel=1e-9)
    assert 0 < change.low < change.value < change.high < 0.1
    assert change == Figure("RMS change / FP32 std", change.value, change.low, change.high, "", "higher", "max_rel_error")
    assert verdicts(judge(REG, ref, out)) == {"RMS change / FP32 std": "pass"}
    assert verdicts(judge(REG, ref, ref * 1.5)) == {"RMS change / FP32 std": "fail"}

    r2, beside = feed(RegressionStats(REG, INT8.threshold), ref, out, target).figures(0.95)
    assert r2.metric == "R² drop" and beside == replace(change, gated=False)
    assert verdicts(judge(REG, ref, ref * 1.5, target)) == {"R² drop": "fail", "RMS change / FP32 std": "reported"}


def test_a_few_changed_samples_give_a_zero_lower_bound_not_a_nan() -> None:
    """Three samples, one of them changed: the lower bound of the mean squared change is below 0, so the RMS bound is 0
    (not the square root of a negative number); the upper bound is the square root of the upper bound."""
    ref = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    out = ref.copy()
    out[2] += 0.5
    [change] = feed(RegressionStats(REG, INT8.threshold), ref, out).figures(0.95)
    value, _, high = rms_change(ref, out, 0.95)
    assert (change.value, change.low, change.high) == pytest.approx((value, 0.0, high), rel=1e-9)
    assert change.value == pytest.approx(math.sqrt(0.25 / 3) / float(ref.astype(np.float64).std()), rel=1e-9)


def test_a_constant_fp32_output_is_judged_on_the_raw_rms_change() -> None:
    """An output FP32 keeps at 3.3 (a bias head, a padding channel) has no spread: the variant's change is measured in the
    output's own units, not divided by the rounding noise of sum-of-squares − n·mean², which made 0.001 look like 10⁵."""
    rng = np.random.default_rng(2905)
    ref = np.full((2000, 4), 3.3, np.float32)
    out = (ref + rng.normal(scale=0.001, size=ref.shape)).astype(np.float32)
    [change] = feed(RegressionStats(REG, INT8.threshold), ref, out, batch=1000).figures(0.95)
    assert (change.value, change.low, change.high) == pytest.approx(rms_change(ref, out, 0.95, std=1.0), rel=1e-9)
    assert 0.0009 < change.value < 0.0011
    assert judge(REG, ref, out, batch=1000).passed


def test_an_output_far_from_zero_is_scaled_by_its_exact_spread() -> None:
    """Values around 10⁶ ± 0.05 (coordinates in metres, a timestamp): the FP32 spread is computed without cancelling
    10¹² against 10¹², so RMS change / FP32 std is right to 9 digits, batch by batch."""
    rng = np.random.default_rng(2906)
    ref = (1e6 + rng.normal(scale=0.05, size=(1000, 4))).astype(np.float32)
    ref[500:] += np.float32(0.25)  # later batches sit elsewhere: the running mean moves
    out = (ref + rng.normal(scale=0.01, size=ref.shape)).astype(np.float32)
    [change] = feed(RegressionStats(REG, INT8.threshold), ref, out, batch=128).figures(0.95)
    assert (change.value, change.low, change.high) == pytest.approx(rms_change(ref, out, 0.95), rel=1e-9)


def test_targets_without_spread_give_the_raw_squared_error_gain() -> None:
    """Targets that are all 2.0 have no variance to compare against: the R² drop falls back to the mean squared-error gain
    (in the targets' units, ×100), not a division by zero; the FP32 spread is still measured exactly."""
    rng = np.random.default_rng(2907)
    target = np.full((300, 2), 2.0, np.float32)
    ref = (target + rng.normal(scale=0.1, size=target.shape)).astype(np.float32)
    out = (ref + rng.normal(scale=0.1, size=target.shape)).astype(np.float32)
    stats = feed(RegressionStats(REG, INT8.threshold), ref, out, target, batch=64)
    r2, change = stats.figures(0.95)
    gain = ((out.astype(np.float64) - 2.0) ** 2).mean(axis=1) - ((ref.astype(np.float64) - 2.0) ** 2).mean(axis=1)
    assert (r2.value, r2.low, r2.high) == pytest.approx(tuple(x * 100 for x in normal_bounds(gain, 0.95)), rel=1e-9)
    assert change.value == pytest.approx(rms_change(ref, out, 0.95)[0], rel=1e-9)
    mse = float(((out.astype(np.float64) - 2.0) ** 2).mean())
    assert stats.summary()["accuracy"] == pytest.approx(1 - mse, rel=1e-9)


def test_nan_and_inf_in_a_regression_output_do_not_make_the_figures_nan() -> None:
    """A variant with NaN and +Inf values: they are failed by the NaN/Inf count; the figures stay numbers (NaN counted as
    0, Inf as 1e30), so the report still shows a value; the Inf makes the R² drop enormous and its bounds wide, never NaN."""
    rng = np.random.default_rng(2908)
    target, ref = regression_set(rng, 300)
    out = ref.copy()
    out[5, 1], out[17, 0] = np.nan, np.inf
    ref_bad = ref.copy()
    ref_bad[40, 2] = np.nan
    figures = feed(RegressionStats(REG, INT8.threshold), ref_bad, out, target).figures(0.95)
    assert all(math.isfinite(x) for f in figures for x in (f.value, f.low, f.high))
    clean = np.nan_to_num(out.astype(np.float64), nan=0.0, posinf=1e30)
    assert figures[0].value == pytest.approx(r2_drop(np.nan_to_num(ref_bad.astype(np.float64)), clean, target, 0.95)[0], rel=1e-9)
    result = judge(REG, ref, out, target)
    assert not result.passed and verdicts(result) == {"non-finite values": "fail", "R² drop": "undecided", "RMS change / FP32 std": "reported"}


# ---- segmentation --------------------------------------------------------------------------------------------------


def scores(rng: np.random.Generator, classes: np.ndarray, k: int) -> np.ndarray:
    """Per-position class scores whose top-1 is ``classes``."""
    x = rng.normal(size=(*classes.shape, k)).astype(np.float32)
    np.put_along_axis(x, classes[..., None], 5.0, axis=-1)
    return x


def relabel(rng: np.random.Generator, classes: np.ndarray, rate: float, k: int) -> np.ndarray:
    """``classes`` with a fraction ``rate`` of positions moved to another class."""
    moved = rng.random(classes.shape) < rate
    return np.where(moved, (classes + rng.integers(1, k, classes.shape)) % k, classes)


def iou_sums(pred: np.ndarray, truth: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per sample and class: intersection and union of the positions predicted and labelled as that class."""
    p, t = pred.reshape(len(pred), -1, 1) == np.arange(k), truth.reshape(len(truth), -1, 1) == np.arange(k)
    return (p & t).sum(axis=1).astype(np.float64), (p | t).sum(axis=1).astype(np.float64)


def miou(inter: np.ndarray, union: np.ndarray) -> float:
    """IoU per class over the summed samples, averaged over the classes present (union > 0)."""
    i, u = inter.sum(axis=0), union.sum(axis=0)
    return float(np.mean([a / b for a, b in zip(i, u) if b > 0]))


def miou_drop(ref: np.ndarray, out: np.ndarray, truth: np.ndarray, k: int, confidence: float) -> tuple[float, float, float]:
    """The mIoU drop in points with paired bootstrap bounds: 400 resamples of the samples (seed 0), the same for both."""
    ri, ru = iou_sums(ref, truth, k)
    oi, ou = iou_sums(out, truth, k)
    draws = np.random.default_rng(0).integers(0, len(truth), (BOOTSTRAP_DRAWS, len(truth)))
    drops = [(miou(ri[d], ru[d]) - miou(oi[d], ou[d])) * 100 for d in draws]
    low, high = np.quantile(drops, [1 - confidence, confidence])
    return (miou(ri, ru) - miou(oi, ou)) * 100, float(low), float(high)


def segmentation_set(rng: np.random.Generator, n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Labels of 3×2 maps with 4 classes (more classes than rows or columns) and FP32 decisions with 10% wrong."""
    truth = rng.integers(0, 4, (n, 3, 2))
    return truth, relabel(rng, truth, 0.10, 4)


def test_a_segmentation_variant_that_loses_mious_fails_and_a_better_one_passes() -> None:
    """The mIoU drop is FP32's mIoU minus the variant's, in points: a variant that mislabels 20% more positions loses
    about 25 points and fails; one closer to the labels than FP32 has a negative drop and passes. Its bounds are the
    paired bootstrap quantiles (the same resample for both), ordered around the drop."""
    rng = np.random.default_rng(2911)
    truth, ref_pred = segmentation_set(rng)
    worse_pred, better_pred = relabel(rng, ref_pred, 0.20, 4), relabel(rng, truth, 0.02, 4)
    ref, worse, better = scores(rng, ref_pred, 4), scores(rng, worse_pred, 4), scores(rng, better_pred, 4)

    [drop] = feed(SegmentationStats(SEG, INT8.threshold), ref, worse, truth, batch=64).figures(0.95)
    assert (drop.value, drop.low, drop.high) == pytest.approx(miou_drop(ref_pred, worse_pred, truth, 4, 0.95), rel=1e-9)
    assert 1 < drop.low < drop.value < drop.high and 15 < drop.value < 35
    assert drop == Figure("mIoU drop", drop.value, drop.low, drop.high, "points", "higher", "max_drop_points")
    result = judge(SEG, ref, worse, truth)
    assert not result.passed and result.failures[0].startswith("output 'mask' (segmentation): mIoU drop ")
    assert verdicts(result) == {"mIoU drop": "fail"}

    [drop] = feed(SegmentationStats(SEG, INT8.threshold), ref, better, truth, batch=64).figures(0.9)
    assert (drop.value, drop.low, drop.high) == pytest.approx(miou_drop(ref_pred, better_pred, truth, 4, 0.9), rel=1e-9)
    assert drop.low < drop.value < drop.high < 0
    assert judge(SEG, ref, better, truth).passed


def test_the_report_shows_miou_of_the_variant_and_of_fp32_and_the_agreement() -> None:
    """With labels the accuracy columns are the variant's and FP32's mIoU, and agreement the share of positions whose class
    the variant keeps; without labels only the agreement."""
    rng = np.random.default_rng(2912)
    truth, ref_pred = segmentation_set(rng, 200)
    out_pred = relabel(rng, ref_pred, 0.15, 4)
    ref, out = scores(rng, ref_pred, 4), scores(rng, out_pred, 4)
    agreement = float((ref_pred == out_pred).mean())
    summary = feed(SegmentationStats(SEG, INT8.threshold), ref, out, truth, batch=50).summary()
    assert summary == pytest.approx({"accuracy": miou(*iou_sums(out_pred, truth, 4)), "reference_accuracy": miou(*iou_sums(ref_pred, truth, 4)),
                                     "agreement": agreement}, rel=1e-12)  # fmt: skip
    assert summary["accuracy"] < summary["reference_accuracy"] < 1  # type: ignore[operator]
    assert feed(SegmentationStats(SEG, INT8.threshold), ref, out, batch=50).summary() == pytest.approx({"agreement": agreement}, rel=1e-12)
    assert SegmentationStats(SEG, INT8.threshold).summary() == {"agreement": None}


def test_without_labels_the_rate_of_positions_changing_class_is_judged() -> None:
    """Without labels the gated figure is the share of positions (per sample, then averaged) whose top-1 class the variant
    changes, in points, with normal bounds of the per-sample rates: 10% changed fails a 1-point limit, none passes."""
    rng = np.random.default_rng(2913)
    ref_pred = rng.integers(0, 4, (250, 3, 2))
    out_pred = relabel(rng, ref_pred, 0.10, 4)
    ref, out = scores(rng, ref_pred, 4), scores(rng, out_pred, 4)
    [flips] = feed(SegmentationStats(SEG, INT8.threshold), ref, out, batch=64).figures(0.95)
    per_sample = (ref_pred != out_pred).reshape(250, -1).mean(axis=1) * 100
    assert (flips.value, flips.low, flips.high) == pytest.approx(normal_bounds(per_sample, 0.95), rel=1e-9)
    assert flips == Figure("positions changing class", flips.value, flips.low, flips.high, "points", "higher", "max_drop_points")
    assert verdicts(judge(SEG, ref, out)) == {"positions changing class": "fail"}
    assert verdicts(judge(SEG, ref, scores(rng, ref_pred, 4))) == {"positions changing class": "pass"}


def test_classes_absent_from_a_sample_or_from_the_set_are_not_averaged_in() -> None:
    """mIoU averages the classes present (predicted or labelled): class 5 appears nowhere and class 3 only in some samples,
    so neither counts as an IoU of 0 or 1 where it is absent; class 4, at a single position that FP32 gets right and the
    variant misses, counts (IoU 1 and 0); a set where everything is class 0 has mIoU 1, not 1/2."""
    rng = np.random.default_rng(2914)
    k, n = 6, 200
    truth = rng.integers(0, 3, (n, 4, 4))
    truth[::10, 0, 0] = 3  # class 3 in one sample of ten
    ref_pred, out_pred = relabel(rng, truth, 0.05, 4), relabel(rng, truth, 0.12, 4)  # classes 0-3 only
    truth[7, 2, 1] = ref_pred[7, 2, 1] = 4
    kind = OutputKind("mask", "segmentation", "test", classes=k)
    stats = feed(SegmentationStats(kind, INT8.threshold), scores(rng, ref_pred, k), scores(rng, out_pred, k), truth, batch=64)
    [drop] = stats.figures(0.95)
    assert (drop.value, drop.low, drop.high) == pytest.approx(miou_drop(ref_pred, out_pred, truth, k, 0.95), rel=1e-9)
    summary = stats.summary()
    assert summary["reference_accuracy"] == pytest.approx(miou(*iou_sums(ref_pred, truth, k)), rel=1e-12)
    assert summary["accuracy"] == pytest.approx(miou(*iou_sums(out_pred, truth, k)), rel=1e-12)

    background = np.zeros((20, 4, 4), np.int64)
    stats = feed(SegmentationStats(kind, INT8.threshold), scores(rng, background, k), scores(rng, background, k), background)
    assert stats.summary() == {"accuracy": 1.0, "reference_accuracy": 1.0, "agreement": 1.0}
    [drop] = stats.figures(0.95)
    assert (drop.value, drop.low, drop.high) == (0.0, 0.0, 0.0)


def test_nan_in_a_losing_class_score_does_not_change_the_position_class() -> None:
    """A variant with NaN in the score of a class that is not the top-1 (the NaN itself is failed by the NaN/Inf count): the
    position keeps its class, counted as a score of 0, instead of argmax picking the NaN."""
    rng = np.random.default_rng(2915)
    pred = rng.integers(0, 4, (100, 3, 2))
    ref = scores(rng, pred, 4)
    out = ref.copy()
    loser = (pred + 1) % 4
    nan_at = rng.random(pred.shape) < 0.3
    np.put_along_axis(out, loser[..., None], np.where(nan_at[..., None], np.nan, np.take_along_axis(out, loser[..., None], -1)), -1)
    assert np.isnan(out).sum() == nan_at.sum() > 0
    stats = feed(SegmentationStats(SEG, INT8.threshold), ref, out, pred)
    assert stats.summary() == {"accuracy": 1.0, "reference_accuracy": 1.0, "agreement": 1.0}
    result = judge(SEG, ref, out)
    assert verdicts(result) == {"non-finite values": "fail", "positions changing class": "pass"}


def test_a_batch_with_no_elements_changes_nothing() -> None:
    """A regression output with a dynamic axis of length 0 in one batch (no boxes found, say): that batch neither
    moves the spread nor the change, and a run of only such batches judges 0 change instead of crashing or NaN."""

    rng = np.random.default_rng(5)
    ref = rng.normal(size=(6, 3))
    out = ref + rng.normal(scale=0.1, size=ref.shape)
    empty = np.zeros((4, 0))
    kind = OutputKind("boxes", "regression", "test")
    alone, mixed, only_empty = (task_stats_for(kind, 0.5) for _ in range(3))
    alone.add(ref, out, ref * 2)
    mixed.add(ref, out, ref * 2)
    mixed.add(empty, empty, empty)
    both = [(f.metric, f.value) for f in mixed.figures(0.95)]
    assert mixed.samples == 10 and not any(np.isnan(v) for _, v in both)
    expected_change = np.sqrt(np.concatenate([((out - ref) ** 2).mean(axis=1), np.zeros(4)]).mean()) / ref.std()
    assert dict(both)["RMS change / FP32 std"] == pytest.approx(expected_change)
    assert mixed.summary()["reference_accuracy"] == pytest.approx(1 - ((ref - ref * 2) ** 2).mean(axis=1).sum() / 10 / (ref * 2).var())
    only_empty.add(empty, empty, None)
    assert [(f.metric, f.value) for f in only_empty.figures(0.95)] == [("RMS change / FP32 std", 0.0)]
    labelled = task_stats_for(kind, 0.5)
    labelled.add(empty, empty, empty)
    assert [(f.metric, f.value) for f in labelled.figures(0.95)] == [("R² drop", 0.0), ("RMS change / FP32 std", 0.0)]
