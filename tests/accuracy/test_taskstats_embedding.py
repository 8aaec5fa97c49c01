"""What an embedding output is judged on (pipeline.accuracy.taskstats.EmbeddingStats): the cosine of each sample to FP32
(mean, with bounds, and 5th percentile) and how many samples keep their nearest neighbour.

Every expected figure is worked out here from the geometry of the data (angles between vectors, counts
of moved neighbours), and bounds from their textbook formulas (the normal bound of a mean; Wilson's
bound as the root of its quadratic), never by calling the code under test. The outputs go through the
same Comparison and judge the build and ``verify`` use, and the rows asserted are the ones the accuracy
report shows.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from pipeline.accuracy.compare import new_comparison
from pipeline.accuracy.gates import Gates, tolerance_for
from pipeline.accuracy.judging import VariantResult, judge_comparison
from pipeline.accuracy.outputkinds import OutputKind
from pipeline.accuracy.taskstats import NEIGHBOUR_SAMPLES, task_stats_for

INT8 = tolerance_for("int8", Gates())  # min cosine 0.99, 5th-percentile cosine 0.95, neighbour agreement 0.9; no atol
KIND = OutputKind("emb", "embedding", "test")
Z = NormalDist().inv_cdf(INT8.confidence)  # each bound one-sided at the gate's confidence


def judged(ref: np.ndarray, out: np.ndarray, batches: list[int] | None = None) -> tuple[VariantResult, dict]:
    comparison = new_comparison("int8-onnx", {"emb": KIND}, INT8.threshold)
    start = 0
    for size in batches or [len(ref)]:
        comparison.add({"emb": ref[start : start + size]}, {"emb": out[start : start + size]}, {})
        start += size
    assert start == len(ref)
    return judge_comparison("int8-onnx", "int8", "onnx", comparison, INT8, {"emb": KIND}), comparison.as_dict()["outputs"]["emb"]


def rows_by_metric(result: VariantResult) -> dict[str, dict]:
    return {r["metric"]: r for r in result.rows}


def row(metric: str, value: object, low: object, high: object, limit: float, verdict: str) -> dict:
    return {"output": "emb", "kind": "embedding", "metric": metric, "value": value, "low": low, "high": high, "unit": "", "worse": "lower",
            "limit": limit, "verdict": verdict}


def on_circle(degrees: np.ndarray, norms: np.ndarray) -> np.ndarray:
    radians = np.deg2rad(degrees)
    return np.stack([np.cos(radians), np.sin(radians)], axis=1) * norms[:, None]


def mean_bounds_of(values: list[float]) -> tuple[float, float, float]:
    """The normal bound of a mean, from the sample standard deviation."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, mean - Z * sd / math.sqrt(n), mean + Z * sd / math.sqrt(n)


def wilson_rate_bounds(k: int, n: int) -> tuple[float, float]:
    """Wilson's bounds of a rate k/n: the roots p of (k/n − p)² = z²·p(1 − p)/n."""
    p = k / n
    a, b, c = n + Z * Z, -(2 * n * p + Z * Z), n * p * p
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


def at_cosine(rng: np.random.Generator, vectors: np.ndarray, cosine: float) -> np.ndarray:
    """Vectors at exactly ``cosine`` to each of ``vectors`` (a random direction perpendicular to each added)."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    other = rng.normal(size=vectors.shape)
    other -= (other * unit).sum(axis=1, keepdims=True) * unit
    other /= np.linalg.norm(other, axis=1, keepdims=True)
    return cosine * unit + math.sqrt(1 - cosine * cosine) * other


def test_every_row_of_an_embedding_variant_with_three_neighbours_moved() -> None:
    """36 triplets of 2-D embeddings at 10j, 10j+1 and 10j+3 degrees (the nearest of each is the middle one, of the middle one
    the first), of lengths from 0.4 to 3.3 that differ between FP32 and the variant: only angles count. The variant moves the
    middle vector of 3 triplets by 1.2 degrees (to 10j+2.2), which makes its nearest neighbour the third: 3 of 108 samples
    lose their neighbour, and those 3 have a cosine of cos(1.2°)."""
    moved = [0, 7, 20]
    ref_angles = np.array([10 * j + d for j in range(36) for d in (0.0, 1.0, 3.0)])
    out_angles = ref_angles.copy()
    out_angles[[3 * j + 1 for j in moved]] += 1.2
    i = np.arange(108)
    ref = on_circle(ref_angles, 0.5 + (i % 5) * 0.7)  # lengths below and above 1
    out = on_circle(out_angles, 0.4 + (i % 3) * 1.1)

    result, shown = judged(ref, out, batches=[50, 58])

    cosines = [1.0] * 105 + [math.cos(math.radians(1.2))] * 3
    mean, low, high = mean_bounds_of(cosines)
    agree_low, agree_high = (1 - b for b in reversed(wilson_rate_bounds(3, 108)))
    a = pytest.approx
    assert result.rows == [
        row("mean cosine to FP32", a(mean, abs=1e-12), a(low, abs=1e-12), a(high, abs=1e-12), 0.99, "pass"),
        row("5th-percentile cosine", a(1.0, abs=1e-12), a(1.0, abs=1e-12), a(1.0, abs=1e-12), 0.95, "pass"),
        row("nearest-neighbour agreement", a(105 / 108, abs=1e-12), a(agree_low, abs=1e-9), a(agree_high, abs=1e-9), 0.9, "pass"),
    ]
    assert result.passed and 0.9 < agree_low < 105 / 108 < agree_high < 1  # real bounds on both sides, the lower one past the limit
    assert shown["agreement"] == a(mean, abs=1e-12)  # the tables' agreement column: the mean cosine


def test_a_tenth_of_the_samples_far_off_fails_on_the_5th_percentile_though_the_mean_passes() -> None:
    """6 of 101 samples at cosine 0.9 (25.8 degrees off), the rest only rescaled: the mean cosine (0.9941, lower bound
    0.9902) passes INT8's 0.99, and the 5th-percentile cosine, sample 6 of 101 from the bottom, is 0.9: the variant fails
    on it. The 6th percentile (sample 7) would be 1.0 and pass."""
    rng = np.random.default_rng(11)
    ref = rng.normal(size=(101, 8))
    out = ref * 2.0
    bad = rng.choice(101, 6, replace=False)
    out[bad] = at_cosine(rng, ref[bad], 0.9) * 3.0

    result, _ = judged(ref, out)

    mean, low, high = mean_bounds_of([1.0] * 95 + [0.9] * 6)
    a = pytest.approx
    rows = rows_by_metric(result)
    assert rows["mean cosine to FP32"] == row("mean cosine to FP32", a(mean, abs=1e-12), a(low, abs=1e-12), a(high, abs=1e-12), 0.99, "pass")
    assert 0.99 < low < mean
    assert rows["5th-percentile cosine"] == row("5th-percentile cosine", a(0.9, abs=1e-12), a(0.9, abs=1e-12), a(0.9, abs=1e-12), 0.95, "fail")
    assert "output 'emb' (embedding): 5th-percentile cosine 0.9 < 0.95 allowed" in result.failures


def test_zero_vectors_from_the_variant_count_as_cosine_0_not_nan() -> None:
    """A variant that outputs all zeros for 10 of 100 samples (a saturated or dead layer): those samples have no direction,
    their cosine to FP32 is 0, so the mean cosine is 0.9 and the 5th percentile 0; both fail, with numbers, not NaN."""
    rng = np.random.default_rng(12)
    ref = rng.normal(size=(100, 16)).astype(np.float32)
    out = ref * np.float32(0.5)
    out[rng.choice(100, 10, replace=False)] = 0.0

    result, shown = judged(ref, out)

    mean, low, high = mean_bounds_of([1.0] * 90 + [0.0] * 10)
    a = pytest.approx
    rows = rows_by_metric(result)
    assert rows["mean cosine to FP32"] == row("mean cosine to FP32", a(0.9, abs=1e-6), a(low, abs=1e-6), a(high, abs=1e-6), 0.99, "fail")
    assert rows["5th-percentile cosine"] == row("5th-percentile cosine", 0.0, 0.0, 0.0, 0.95, "fail")
    assert shown["agreement"] == a(0.9, abs=1e-6)


def test_three_samples_are_enough_to_see_a_neighbour_change_and_two_are_not() -> None:
    """At 0, 1 and 3 degrees, the nearest of the first is the second; moving the second to 2.2 degrees makes the third its
    nearest: 1 of 3 samples loses its neighbour (measured; too few samples to decide). With 2 samples each one's only
    neighbour is the other, so agreement cannot change and no neighbour figure is claimed."""
    ref = on_circle(np.array([0.0, 1.0, 3.0]), np.ones(3))
    out = on_circle(np.array([0.0, 2.2, 3.0]), np.ones(3))

    three, _ = judged(ref, out)
    two, _ = judged(ref[:2], out[:2])

    low, high = (1 - b for b in reversed(wilson_rate_bounds(1, 3)))
    a = pytest.approx
    assert rows_by_metric(three)["nearest-neighbour agreement"] == row("nearest-neighbour agreement", a(2 / 3, abs=1e-12), a(low, abs=1e-9),
                                                                       a(high, abs=1e-9), 0.9, "undecided")  # fmt: skip
    assert [r["metric"] for r in two.rows] == ["mean cosine to FP32", "5th-percentile cosine"]


def test_the_neighbour_check_covers_the_first_neighbour_samples_across_batches_and_the_cosines_every_sample() -> None:
    """The neighbour check keeps the first NEIGHBOUR_SAMPLES samples (its similarity matrix is n²), whatever the batches:
    here NEIGHBOUR_SAMPLES − 1, then 10 (1 of which fills it), then 10. The variant is exact on those and points the other
    way on the 19 after them: neighbour agreement is 1 with the Wilson lower bound of 0 changes in NEIGHBOUR_SAMPLES,
    n / (n + z²), while the mean cosine counts every sample: (n − 19) / (n + 19)."""
    rng = np.random.default_rng(13)
    n = NEIGHBOUR_SAMPLES
    ref = rng.normal(size=(n + 19, 8))
    out = ref.copy()
    out[n:] = -ref[n:]

    result, shown = judged(ref, out, batches=[n - 1, 10, 10])

    rows = rows_by_metric(result)
    a = pytest.approx
    assert rows["nearest-neighbour agreement"] == row("nearest-neighbour agreement", 1.0, a(n / (n + Z * Z), abs=1e-12), 1.0, 0.9, "pass")
    assert rows["mean cosine to FP32"]["value"] == a((n - 19) / (n + 19), abs=1e-12)
    assert rows["5th-percentile cosine"]["value"] == a(1.0, abs=1e-12)
    assert shown["agreement"] == a((n - 19) / (n + 19), abs=1e-12)


def test_no_agreement_before_any_batch() -> None:
    """A table made before any batch shows no agreement (None), as for the other kinds, rather than failing."""
    assert task_stats_for(KIND, INT8.threshold).summary() == {"agreement": None}
