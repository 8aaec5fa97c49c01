"""Confidence bounds of the gates' figures.

**Accuracy drop with its uncertainty.** A variant is compared with FP32 on the *same* samples, so
the comparison is paired: ``b`` samples FP32 gets right and the variant wrong, ``c`` the reverse;
the drop is ``(b − c) / n``. Its bounds are Tango's score bounds for a difference of paired
proportions (the interval used for non-inferiority tests on matched pairs; it stays sensible at
zero flips, where Wald-type intervals collapse to a point), each one-sided at ``confidence``
(approximately: measured one-sided coverage in tests/accuracy/test_gates.py is ≥ 93% at a nominal 95%). A
gate **passes** when ``high ≤ limit``, **fails** when ``low > limit``, and otherwise the evaluation
set cannot decide (pipeline.accuracy.judging). Even a perfect result (no sample flips) needs
``n ≥ z²(1 − L)/L`` samples (:func:`min_samples`): 268 for 1 point, 539 for 0.5, 1351 for 0.2 at
95% (z = 1.645).

Without labels, top-1 disagreement with FP32 (an upper bound on the drop) has Wilson score bounds.
Per-sample means (multi-label decisions, positions of a segmentation map, regression errors) have
the normal-approximation bounds of a mean over samples (:func:`mean_bounds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


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


def mean_bounds(values: "np.ndarray", confidence: float) -> tuple[float, float, float]:
    """The mean of per-sample values with one-sided normal-approximation bounds (each at ``confidence``)."""
    import numpy as np

    n = len(values)
    if n == 0:
        return 0.0, 0.0, 0.0
    mean = float(np.mean(values))
    half = _z(confidence) * float(np.std(values, ddof=1)) / math.sqrt(n) if n > 1 else math.inf
    return mean, mean - half, mean + half
