"""The accuracy gate judges a drop with its uncertainty: pass, fail, or 'not enough data to judge'."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.accuracy.bounds import DropEstimate, disagreement, min_samples, paired_drop
from pipeline.accuracy.compare import OutputStats
from pipeline.accuracy.judging import judge_figure


def judge_drop(estimate: DropEstimate, limit_points: float) -> tuple[str, str]:
    """A drop judged as the build's accuracy stage judges a top-1 figure (pipeline.accuracy.judging)."""
    metric = "accuracy drop (top-1)" if estimate.paired else "top-1 disagreement"
    return judge_figure("probs", "classes", metric, estimate.drop, estimate.low, estimate.high, "points", "higher", limit_points,
                        estimate.samples, estimate.confidence, min_samples(limit_points, estimate.confidence))


def test_one_flipped_sample_on_a_small_set_is_not_a_failure_but_undecided() -> None:
    # 512 samples, one sample flipped: 0.2 points, exactly a 0.2-point limit. Noise, not a measured drop.
    verdict, why = judge_drop(paired_drop(1, 0, 512, 0.95), 0.2)
    assert verdict == "undecided"
    assert "not enough evaluation data to judge a 0.2-point limit" in why
    assert "needs ≥ 1351 samples" in why


def test_a_real_drop_on_a_small_set_fails_when_its_lower_bound_is_past_the_limit() -> None:
    # 5 points down on 400 samples (20 more wrong, none better): clearly past a 1-point limit.
    estimate = paired_drop(20, 0, 400, 0.95)
    assert estimate.drop == pytest.approx(5.0)
    assert estimate.low > 1.0
    assert judge_drop(estimate, 1.0)[0] == "fail"


def test_a_half_point_drop_on_a_small_set_does_not_pass_a_point_two_limit() -> None:
    # The old gate passed this only if the observed drop happened to be small; now it cannot pass.
    assert judge_drop(paired_drop(2, 0, 400, 0.95), 0.2)[0] != "pass"


def test_no_flips_on_enough_samples_passes_and_the_bounds_contain_the_drop() -> None:
    n = min_samples(1.0, 0.95)
    assert n == 268
    assert judge_drop(paired_drop(0, 0, n, 0.95), 1.0)[0] == "pass"
    assert judge_drop(paired_drop(0, 0, n - 1, 0.95), 1.0)[0] == "undecided"
    e = paired_drop(7, 3, 2000, 0.95)
    assert e.drop == pytest.approx(0.2) and e.low < e.drop < e.high


@pytest.mark.parametrize(("worse", "better", "n"), [(0.02, 0.01, 500), (0.005, 0.0, 300), (0.03, 0.03, 1000)])
def test_each_bound_covers_the_true_drop_at_about_the_stated_confidence(worse: float, better: float, n: int) -> None:
    # Monte Carlo with a fixed seed: score bounds are approximate; each one-sided 95% bound must cover ≥ 93%.
    rng = np.random.default_rng(0)
    truth = (worse - better) * 100
    above = below = 0
    trials = 600
    for _ in range(trials):
        draws = rng.multinomial(n, [worse, better, 1 - worse - better])
        e = paired_drop(int(draws[0]), int(draws[1]), n, 0.95)
        above += truth <= e.high + 1e-9
        below += e.low - 1e-9 <= truth
    assert above / trials >= 0.93 and below / trials >= 0.93


def test_unlabeled_disagreement_is_judged_the_same_way() -> None:
    assert judge_drop(disagreement(0, 400, 0.95), 1.0)[0] == "pass"
    verdict, why = judge_drop(disagreement(2, 128, 0.95), 1.0)
    assert verdict == "undecided" and "output 'probs' (classes): top-1 disagreement 1.56 points" in why


def test_cosine_statistics_and_figure_judging() -> None:
    stats = OutputStats()
    ref = np.array([[1.0, 2.0, 3.0], [0.5, 0.1, -1.0]], dtype=np.float32)
    stats.add(ref, ref * 1.001)
    assert stats.mean_cosine == pytest.approx(1.0) and stats.rel_l2 == pytest.approx(1e-3, rel=1e-3)
    stats.add(ref, -ref)
    assert stats.min_cosine == pytest.approx(-1.0)
    # a figure where lower is worse passes on its low bound, fails on its high bound, else is undecided
    assert judge_figure("v", "embedding", "mean cosine", 0.999, 0.998, 0.9995, "", "lower", 0.99, 100, 0.95) == ("pass", "")
    verdict, why = judge_figure("v", "embedding", "mean cosine", 0.9, 0.85, 0.95, "", "lower", 0.99, 100, 0.95)
    assert verdict == "fail" and "output 'v' (embedding): mean cosine 0.9 [0.85, 0.95]" in why and "< 0.99 allowed" in why
    assert judge_figure("v", "embedding", "mean cosine", 0.99, 0.98, 0.995, "", "lower", 0.99, 100, 0.95)[0] == "undecided"
    assert judge_figure("r", "regression", "RMS change", 0.4, 0.3, 0.5, "", "higher", 0.1, 100, 0.95)[0] == "fail"


SHARED_OPTIONS = r"""
import json, math
from dataclasses import fields
from pipeline.accuracy.gates import GATE_GROUP, Gates
from pipeline.commands.verify import VerifyConfig
out = {}
for cls in (Gates, VerifyConfig):
    for f in fields(cls):
        if f.name in ("fp16_max_drop", "int8_max_drop", "gate_confidence"):
            o = f.metadata["option"]
            out[f"{cls.__name__}.{f.name}"] = {"default": f.default, "help": o.help, "group": o.group == GATE_GROUP,
                                               "refused": [repr(v) for v in (-0.5, math.nan, 0.3, 1.5, 0.0) if o.check(v)]}
print(json.dumps(out))
"""


def test_build_and_verify_share_the_documented_drop_limits_and_refuse_bad_ones() -> None:
    """``--fp16-max-drop``, ``--int8-max-drop`` and ``--gate-confidence`` are made when pipeline.accuracy.gates is imported
    (dataclass fields), so a fresh interpreter reads them: 1 point each at 95%, a negative or NaN limit refused
    (a NaN limit passes everything), a confidence outside [0.5, 0.999] refused, the help naming what is limited."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", SHARED_OPTIONS], cwd=root, env=dict(os.environ, PYTHONPATH=str(root)),
                          capture_output=True, text=True, check=True)
    got = json.loads(proc.stdout)
    for owner in ("Gates", "VerifyConfig"):
        fp16, int8, confidence = (got[f"{owner}.{name}"] for name in ("fp16_max_drop", "int8_max_drop", "gate_confidence"))
        assert (fp16["default"], int8["default"], confidence["default"]) == (1.0, 1.0, 0.95)
        assert fp16["refused"] == int8["refused"] == ["-0.5", "nan"] and confidence["refused"] == ["-0.5", "nan", "0.3", "1.5", "0.0"]
        assert fp16["group"] and int8["group"] and confidence["group"]
        assert fp16["help"].startswith("max drop of FP16 (and FP32 engines) vs FP32, in points: top-1/decision accuracy, R² or mean IoU")
        assert fp16["help"].endswith("changed decisions without; judged with its confidence bounds")
        assert int8["help"] == "max drop of INT8 vs FP32, in points (as --fp16-max-drop), judged with its confidence bounds"
        assert confidence["help"] == "confidence of the accuracy-drop bounds"


def test_each_precision_is_held_to_its_own_limits() -> None:
    """INT8 variants (TensorRT's and the CPU one) to INT8's limits; FP16 and FP32 engines (TF32 may be used) to FP16's."""
    from pipeline.accuracy.gates import Gates, Tolerance, tolerance_for

    gates = Gates(fp16_max_drop=0.3, int8_max_drop=2.0, fp16_atol=0.01, int8_atol=0.2, fp16_min_cosine=0.999, int8_min_cosine=0.9,
                  fp16_max_rel_error=0.02, int8_max_rel_error=0.1, fp16_min_cosine_low=0.995, int8_min_cosine_low=0.8,
                  fp16_min_neighbour_agreement=0.98, int8_min_neighbour_agreement=0.7, binary_threshold=0.4, gate_confidence=0.9)
    fp16 = Tolerance(0.3, 0.01, 0.999, 0.9, 0.02, 0.995, 0.98, 0.4)
    int8 = Tolerance(2.0, 0.2, 0.9, 0.9, 0.1, 0.8, 0.7, 0.4)
    assert [tolerance_for(p, gates) for p in ("fp16", "fp32", "int8", "int8cpu")] == [fp16, fp16, int8, int8]


def _tango_reference(worse: int, better: int, n: int, confidence: float, upper: bool) -> float:
    """Tango's score bound computed another way: the restricted MLE by maximising the trinomial likelihood
    numerically (not the closed-form quadratic root), the bound by bisection. In points."""
    from scipy.optimize import minimize_scalar
    from scipy.special import xlogy
    from scipy.stats import norm

    def statistic(delta: float) -> float:
        low, high = max(0.0, -delta), (1 - delta) / 2
        if high - low < 1e-9:
            p21 = max(low, 0.0)
        else:
            nll = lambda p: -(xlogy(worse, p + delta) + xlogy(better, p) + xlogy(n - worse - better, 1 - 2 * p - delta))  # noqa: E731
            p21 = minimize_scalar(nll, bounds=(low + 1e-15, high - 1e-15), method="bounded", options={"xatol": 1e-14}).x
        variance = n * (2 * p21 + delta * (1 - delta))
        difference = worse - better - n * delta
        if variance > 0:
            return difference / math.sqrt(variance)
        return 0.0 if difference == 0 else math.copysign(math.inf, difference)

    target = -norm.ppf(confidence) if upper else norm.ppf(confidence)
    inside, edge = (worse - better) / n, (1.0 if upper else -1.0) * (1 - 1e-12)
    if (statistic(edge) - target) * (statistic(inside) - target) > 0:
        return (1.0 if upper else -1.0) * 100
    for _ in range(50):  # 2 / 2**50: far below the 1e-4-point comparison
        middle = (inside + edge) / 2
        if (statistic(middle) - target) * (statistic(inside) - target) > 0:
            inside = middle
        else:
            edge = middle
    return (inside + edge) / 2 * 100


@pytest.mark.parametrize(("worse", "better", "n", "confidence"), [
    (7, 3, 2000, 0.95), (0, 0, 300, 0.95), (0, 0, 100, 0.8), (20, 0, 400, 0.95), (50, 50, 1000, 0.9), (1, 0, 512, 0.95),
    (3, 1, 50, 0.99), (400, 0, 400, 0.95), (0, 400, 400, 0.95), (0, 30, 300, 0.6), (400, 0, 400, 0.6), (0, 400, 400, 0.6),
])  # fmt: skip
def test_the_score_bounds_are_tangos(worse: int, better: int, n: int, confidence: float) -> None:
    """A bound a little too narrow publishes a variant whose drop may exceed the limit; each bound matches an
    independent computation of Tango's interval to 1e-4 points, also at the edges (no flips, every sample flipped)."""
    e = paired_drop(worse, better, n, confidence)
    assert e.low == pytest.approx(_tango_reference(worse, better, n, confidence, upper=False), abs=1e-4)
    assert e.high == pytest.approx(_tango_reference(worse, better, n, confidence, upper=True), abs=1e-4)
    assert e.drop == pytest.approx((worse - better) / n * 100) and e.low <= e.drop <= e.high


def test_the_disagreement_bounds_are_wilsons() -> None:
    """Without labels: Wilson's score bounds of the disagreement rate, clipped to [0, 100] points."""
    z = 1.6448536269514722
    for k, n in ((0, 400), (2, 128), (128, 128), (64, 128)):
        p = k / n
        centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        e = disagreement(k, n, 0.95)
        assert (e.drop, e.worse, e.better, e.samples, e.paired) == (pytest.approx(p * 100), k, 0, n, False)
        assert e.low == pytest.approx(max(0.0, centre - half) * 100) and e.high == pytest.approx(min(1.0, centre + half) * 100)


def test_sample_counts_at_the_edges() -> None:
    """One sample, or none (a gate never divides by zero); the limits at which a perfect result can pass."""
    one = paired_drop(1, 0, 1, 0.95)
    assert (one.drop, one.worse, one.better, one.samples, one.paired) == (100.0, 1, 0, 1, True)
    assert paired_drop(0, 0, 0, 0.95).drop == 0.0 and disagreement(1, 1, 0.95).drop == 100.0 and disagreement(0, 0, 0.95).drop == 0.0
    assert min_samples(0.0, 0.95) == math.inf and min_samples(100.0, 0.95) == 1 and min_samples(150.0, 0.95) == 1
    assert min_samples(50.0, 0.95) == 3  # ceil(1.645² · 0.5 / 0.5)


def test_mean_bounds_of_none_one_and_two_values() -> None:
    from pipeline.accuracy.bounds import mean_bounds

    assert mean_bounds(np.array([]), 0.95) == (0.0, 0.0, 0.0)
    assert mean_bounds(np.array([0.3]), 0.95) == (0.3, -math.inf, math.inf)  # one sample bounds nothing
    mean, low, high = mean_bounds(np.array([1.0, 3.0]), 0.95)
    half = 1.6448536269514722 * math.sqrt(2.0) / math.sqrt(2)
    assert mean == 2.0 and low == pytest.approx(2.0 - half) and high == pytest.approx(2.0 + half)


@pytest.mark.parametrize(("precision", "engine", "tf32", "atol"), [
    ("fp32", True, True, 0.02),  # an FP32 TensorRT engine built with TF32 (the default): TF32's own limit
    ("fp32", True, False, 0.003),  # built with --no-tf32: IEEE FP32 kernels, the tight limit
    ("fp32", False, True, 0.05),  # the FP32 ONNX file itself is never an engine: FP16's tolerance
    ("fp16", True, True, 0.05),  # an FP16 engine keeps FP16's limit, TF32 or not
    ("fp16", True, False, 0.05),
    ("int8", True, True, 0.4),  # an INT8 engine keeps INT8's limit
    ("int8-cpu", False, True, 0.4),  # the CPU INT8 variant is INT8 too
])
def test_each_precision_and_engine_is_held_to_its_own_max_abs_error(precision: str, engine: bool, tf32: bool, atol: float) -> None:
    """Which ``atol`` a variant is judged against: a wrong pick publishes a TF32 engine against the --no-tf32 limit
    (a false failure) or an INT8 engine against FP32's (a false pass). Distinct limits, so each pick shows."""
    from pipeline.accuracy.gates import Gates, tolerance_for

    gates = Gates(fp16_atol=0.05, int8_atol=0.4, tf32_atol=0.02, fp32_engine_atol=0.003, fp16_max_drop=0.5, int8_max_drop=2.0,
                  fp16_min_cosine=0.999, int8_min_cosine=0.99, fp16_max_rel_error=0.01, int8_max_rel_error=0.1,
                  fp16_min_cosine_low=0.995, int8_min_cosine_low=0.95, fp16_min_neighbour_agreement=0.98, int8_min_neighbour_agreement=0.9)
    tolerance = tolerance_for(precision, gates, engine=engine, tf32=tf32)
    assert tolerance.atol == atol
    family = "int8" if precision.startswith("int8") else "fp16"  # every other limit is the family's, engine or not
    assert (tolerance.max_drop_points, tolerance.min_cosine, tolerance.max_rel_error, tolerance.min_cosine_low, tolerance.min_neighbour_agreement) == tuple(
        getattr(gates, f"{family}_{limit}") for limit in ("max_drop", "min_cosine", "max_rel_error", "min_cosine_low", "min_neighbour_agreement"))


def test_by_default_a_variant_is_an_onnx_file_and_an_engine_was_built_with_tf32() -> None:
    """The defaults callers lean on: the served gate passes no ``engine`` (it judges the ONNX files' precisions), and
    an engine's TF32 is TensorRT's default, so an FP32 engine without ``tf32`` gets the TF32 limit."""
    from pipeline.accuracy.gates import Gates, tolerance_for

    gates = Gates(fp16_atol=0.05, int8_atol=0.4, tf32_atol=0.02, fp32_engine_atol=0.003)
    assert tolerance_for("fp32", gates).atol == 0.05
    assert tolerance_for("fp32", gates, engine=True).atol == 0.02
