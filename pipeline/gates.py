"""Accuracy gates: the tolerances (one typed source of their defaults) and how a variant is judged.

The build's accuracy stage and ``verify`` (served accuracy) judge with the same functions.

**Accuracy drop with its uncertainty.** A variant is compared with FP32 on the *same* samples, so
the comparison is paired: ``b`` samples FP32 gets right and the variant wrong, ``c`` the reverse;
the drop is ``(b − c) / n``. Its bounds are Tango's score bounds for a difference of paired
proportions (the interval used for non-inferiority tests on matched pairs; it stays sensible at
zero flips, where Wald-type intervals collapse to a point), each one-sided at ``confidence``
(approximately: measured one-sided coverage in tests/test_gates.py is ≥ 93% at a nominal 95%). The
gate **passes** when ``high ≤ limit`` (the drop is within the limit with that confidence),
**fails** when ``low > limit`` (it exceeds the limit with that confidence), and otherwise the
evaluation set cannot decide: the build stops with "not enough evaluation data to judge a L-point
limit". Even a perfect result (no sample flips) needs ``n ≥ z²(1 − L)/L`` samples: 268 for 1 point,
539 for 0.5, 1351 for 0.2 at 95% (z = 1.645).

Without labels, top-1 disagreement with FP32 (an upper bound on the drop) is judged the same way.

**Every output is judged by its kind** (pipeline.outputkinds; the figures are pipeline.taskstats):
class scores and binary decisions as above; multi-label decisions, positions of a segmentation map
and regression errors by their per-sample means, whose bounds are the normal-approximation bounds
of a mean over samples (:func:`mean_bounds`); mean IoU by a paired bootstrap over samples;
embeddings by cosine similarity and nearest-neighbour agreement. ``--fp16-max-drop`` and
``--int8-max-drop`` limit every labeled task metric in points (top-1 or decision accuracy, R²,
mean IoU) and, without labels, the share of decisions that change. Non-finite values (NaN, ±Inf)
where FP32 has finite ones fail every gate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.options import in_range, non_negative, option

if TYPE_CHECKING:
    import numpy as np

GATE_GROUP = "accuracy gates (each variant against FP32 ONNX on the evaluation data)"


def fp16_max_drop_option() -> Any:
    """``--fp16-max-drop`` (shared by build and verify)."""
    return option(1.0, "max drop of FP16 (and FP32 engines) vs FP32, in points: top-1/decision accuracy, R² or mean IoU with labels, "
                       "changed decisions without; judged with its confidence bounds",
                  check=non_negative, group=GATE_GROUP)


def int8_max_drop_option() -> Any:
    """``--int8-max-drop`` (shared by build and verify)."""
    return option(1.0, "max drop of INT8 vs FP32, in points (as --fp16-max-drop), judged with its confidence bounds", check=non_negative, group=GATE_GROUP)


def confidence_option() -> Any:
    """``--gate-confidence`` (shared by build and verify)."""
    return option(0.95, "confidence of the accuracy-drop bounds", check=in_range(0.5, 0.999), group=GATE_GROUP)


@dataclass(frozen=True)
class Gates:
    """Every accuracy tolerance of a build (and of ``verify``). Drops are in points of top-1 accuracy."""

    parity_atol: float = option(1e-4, "max abs difference ONNX vs TensorFlow per output", check=non_negative, group="conversion")
    parity_rtol: float = option(0.0, "alternatively, max relative difference ONNX vs TensorFlow (0 = off)", check=non_negative, group="conversion")
    fp16_max_drop: float = fp16_max_drop_option()
    fp16_atol: float | None = option(1e-2, "max abs error of FP16 outputs (regression outputs: see --fp16-max-rel-error)", check=non_negative, group=GATE_GROUP)
    tf32_atol: float = option(1e-2, "max abs error of FP32 TensorRT engines built with TF32 (the default; TF32 keeps FP16's 10-bit "
                                    "mantissa, so FP16's limit)", check=non_negative, group=GATE_GROUP)
    fp32_engine_atol: float = option(1e-3, "max abs error of FP32 TensorRT engines built with --no-tf32 (IEEE FP32 kernels: only the "
                                           "order of accumulation differs)", check=non_negative, group=GATE_GROUP)
    int8_max_drop: float = int8_max_drop_option()
    int8_atol: float | None = option(None, "max abs error of INT8 outputs other than regression (default: reported, not gated)", check=non_negative, group=GATE_GROUP)
    fp16_max_rel_error: float = option(0.02, "regression outputs without targets: max RMS change of FP16 over the FP32 output's "
                                             "standard deviation", check=non_negative, group=GATE_GROUP)
    int8_max_rel_error: float = option(0.1, "regression outputs without targets: max RMS change of INT8 over the FP32 output's "
                                            "standard deviation (0.1: a hundredth of its variance)", check=non_negative, group=GATE_GROUP)
    fp16_min_cosine: float = option(0.999, "embedding outputs: min mean cosine similarity of FP16 to FP32 per sample",
                                    check=in_range(-1, 1), group=GATE_GROUP)
    int8_min_cosine: float = option(0.99, "embedding outputs: min mean cosine similarity of INT8 to FP32 per sample",
                                    check=in_range(-1, 1), group=GATE_GROUP)
    fp16_min_cosine_low: float = option(0.995, "embedding outputs: min 5th-percentile cosine similarity of FP16 to FP32",
                                        check=in_range(-1, 1), group=GATE_GROUP)
    int8_min_cosine_low: float = option(0.95, "embedding outputs: min 5th-percentile cosine similarity of INT8 to FP32",
                                        check=in_range(-1, 1), group=GATE_GROUP)
    fp16_min_neighbour_agreement: float = option(0.98, "embedding outputs: min share of evaluation samples whose nearest neighbour "
                                                       "(among the evaluation set) stays the same with FP16", check=in_range(0, 1), group=GATE_GROUP)
    int8_min_neighbour_agreement: float = option(0.9, "embedding outputs: min share of evaluation samples whose nearest neighbour "
                                                      "stays the same with INT8", check=in_range(0, 1), group=GATE_GROUP)
    binary_threshold: float = option(0.5, "binary and multi-label outputs: the decision threshold on the probability "
                                          "(logit outputs are cut at its logit)", check=in_range(1e-6, 1 - 1e-6), group=GATE_GROUP)
    gate_confidence: float = confidence_option()


@dataclass(frozen=True)
class Tolerance:
    """What one variant is held to (picked from :class:`Gates` by precision); the field names are the
    ``limit_key`` of the figures they limit (pipeline.taskstats.Figure)."""

    max_drop_points: float
    atol: float | None
    min_cosine: float
    confidence: float
    max_rel_error: float
    min_cosine_low: float
    min_neighbour_agreement: float
    threshold: float


def tolerance_for(precision: str, gates: Gates, *, engine: bool = False, tf32: bool = True) -> Tolerance:
    """INT8 has its own tolerance; FP16 and FP32 engines share FP16's, except the FP32 engine's max abs
    error: ``tf32_atol`` when it was built with TF32 (TensorRT's default), else ``fp32_engine_atol``."""
    p = "int8" if precision.startswith("int8") else "fp16"
    atol = getattr(gates, f"{p}_atol")
    if engine and precision == "fp32":
        atol = gates.tf32_atol if tf32 else gates.fp32_engine_atol
    return Tolerance(getattr(gates, f"{p}_max_drop"), atol, getattr(gates, f"{p}_min_cosine"), gates.gate_confidence,
                     getattr(gates, f"{p}_max_rel_error"), getattr(gates, f"{p}_min_cosine_low"), getattr(gates, f"{p}_min_neighbour_agreement"),
                     gates.binary_threshold)  # fmt: skip


def _z(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(confidence))


def _tango_z(worse: int, better: int, n: int, delta: float) -> float:
    """Tango's score statistic for H0: drop = ``delta`` in matched pairs (Tango 1998, Stat. Med. 17:891)."""
    a = 2 * n
    b = -worse - better + (2 * n - worse + better) * delta
    c = -better * delta * (1 - delta)
    p21 = (math.sqrt(max(b * b - 4 * a * c, 0.0)) - b) / (2 * a)  # restricted MLE of the 'better' rate
    variance = n * (2 * p21 + delta * (1 - delta))
    if variance <= 0:
        return 0.0 if worse - better == n * delta else math.copysign(math.inf, worse - better - n * delta)
    return (worse - better - n * delta) / math.sqrt(variance)


def _score_bound(worse: int, better: int, n: int, z: float, upper: bool) -> float:
    """The drop at which Tango's statistic reaches ∓z: the one-sided score bound."""
    from scipy.optimize import brentq

    estimate = (worse - better) / n
    target = -z if upper else z
    edge = 1.0 if upper else -1.0
    f = lambda d: _tango_z(worse, better, n, d) - target  # noqa: E731
    if f(edge * (1 - 1e-12)) * f(estimate) > 0:
        return edge
    return float(brentq(f, min(estimate, edge * (1 - 1e-12)), max(estimate, edge * (1 - 1e-12)), xtol=1e-10))


def _wilson(k: int, n: int, z: float, upper: bool) -> float:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return min(1.0, centre + half) if upper else max(0.0, centre - half)


@dataclass(frozen=True)
class DropEstimate:
    """An accuracy drop in points with its bounds, from ``worse``/``better`` discordant samples of ``n``."""

    drop: float
    low: float
    high: float
    worse: int  # reference right, variant wrong (or, without labels, top-1 disagreements)
    better: int  # reference wrong, variant right
    samples: int
    confidence: float
    paired: bool  # False: an unlabeled disagreement rate

    def as_dict(self) -> dict[str, float | int | bool]:
        """JSON form, in points."""
        return {"drop_points": round(self.drop, 4), "low_points": round(self.low, 4), "high_points": round(self.high, 4),
                "worse": self.worse, "better": self.better, "samples": self.samples, "confidence": self.confidence, "paired": self.paired}


def paired_drop(worse: int, better: int, samples: int, confidence: float) -> DropEstimate:
    """The drop ``(worse − better)/samples`` in points, with one-sided score bounds each holding at ``confidence``."""
    n = max(samples, 1)
    z = _z(confidence)
    low, high = _score_bound(worse, better, n, z, upper=False), _score_bound(worse, better, n, z, upper=True)
    return DropEstimate((worse - better) / n * 100, low * 100, high * 100, worse, better, samples, confidence, True)


def disagreement(disagree: int, samples: int, confidence: float) -> DropEstimate:
    """Without labels: the rate of top-1 disagreement with FP32 (an upper bound on the drop), with Wilson score bounds."""
    n = max(samples, 1)
    z = _z(confidence)
    return DropEstimate(disagree / n * 100, _wilson(disagree, n, z, upper=False) * 100, _wilson(disagree, n, z, upper=True) * 100,
                        disagree, 0, samples, confidence, False)


def min_samples(limit_points: float, confidence: float) -> int:
    """The smallest evaluation set on which a perfect result (no flips) passes ``limit_points``: both score
    bounds reduce to ``z²/(n + z²)`` there."""
    rate = limit_points / 100
    if rate <= 0:
        return math.inf  # type: ignore[return-value]
    if rate >= 1:
        return 1
    z = _z(confidence)
    return math.ceil(z * z * (1 - rate) / rate)


def judge_drop(estimate: DropEstimate, limit_points: float) -> tuple[str, str | None]:
    """``("pass" | "fail" | "undecided", why)`` for an estimated drop against a limit in points."""
    what = "top-1 accuracy drop" if estimate.paired else "top-1 disagreement with FP32"
    shown = f"{what} {estimate.drop:.2f} points [{estimate.low:.2f}, {estimate.high:.2f}] ({estimate.confidence:.0%} bounds, {estimate.samples} samples)"
    if estimate.high <= limit_points:
        return "pass", None
    if estimate.low > limit_points:
        return "fail", f"{shown} > {limit_points:g} allowed"
    needed = min_samples(limit_points, estimate.confidence)
    return "undecided", (f"not enough evaluation data to judge a {limit_points:g}-point limit: {shown}"
                         + (f"; even a perfect result needs ≥ {needed} samples" if estimate.samples < needed else ""))


def mean_bounds(values: "np.ndarray", confidence: float) -> tuple[float, float, float]:
    """The mean of per-sample values with one-sided normal-approximation bounds (each at ``confidence``)."""
    import numpy as np

    n = len(values)
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = float(np.mean(values))
    half = _z(confidence) * float(np.std(values, ddof=1)) / math.sqrt(n) if n > 1 else math.inf
    return mean, mean - half, mean + half


def judge_figure(output: str, kind: str, metric: str, value: float, low: float, high: float, unit: str, worse: str,
                 limit: float, samples: int, confidence: float) -> tuple[str, str | None]:
    """``("pass" | "fail" | "undecided", why)`` of one figure against its limit: it passes when its
    bound on the worse side is within the limit, fails when the bound on the better side is beyond it."""
    fmt = (lambda x: f"{x:.2f}") if unit == "points" else (lambda x: f"{x:.4g}")
    shown = f"output '{output}' ({kind}): {metric} {fmt(value)}{' points' if unit == 'points' else ''}"
    if not low == high == value:  # a measured maximum (max abs error) has no bounds to show
        shown += f" [{fmt(low)}, {fmt(high)}] ({confidence:.0%} bounds, {samples} samples)"
    bad, good = (high, low) if worse == "higher" else (low, high)
    within = (lambda x: x <= limit) if worse == "higher" else (lambda x: x >= limit)
    sign = ">" if worse == "higher" else "<"
    if within(bad):
        return "pass", None
    if not within(good):
        return "fail", f"{shown} {sign} {limit:g} allowed"
    return "undecided", f"not enough evaluation data to judge {shown} against {limit:g}"
