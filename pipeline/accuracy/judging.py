"""How one variant's comparison with FP32 is judged, output by output: the verdict the build's
accuracy stage and ``verify``'s served gate both give (figures: pipeline.accuracy.taskstats; limits:
pipeline.accuracy.gates; bounds: pipeline.accuracy.bounds).

A figure **passes** when its bound on the worse side is within the limit, **fails** when its bound
on the better side is beyond it, and is otherwise **undecided**: the evaluation set cannot tell noise
from a real change, and the build stops saying so (for one decision per sample, with the samples
even a perfect result would need, :func:`pipeline.accuracy.bounds.min_samples`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeline.accuracy.bounds import min_samples
from pipeline.accuracy.compare import Comparison
from pipeline.accuracy.gates import Tolerance
from pipeline.accuracy.outputkinds import OutputKind


@dataclass
class VariantResult:
    """One variant's comparison with FP32 and the verdict of its tolerance, figure by figure."""

    variant: str
    precision: str
    kind: str
    tolerance: Tolerance
    comparison: dict
    rows: list[dict] = field(default_factory=list)  # one per judged (or reported) figure of an output
    failures: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures and not self.undecided


def judge_comparison(variant: str, precision: str, kind: str, comparison: Comparison, tolerance: Tolerance,
                     kinds: Mapping[str, OutputKind]) -> VariantResult:
    """Judge every output of one comparison: non-finite values, the figures of its kind (gated or
    reported beside), and ``atol`` on outputs that are not regression values."""
    result = VariantResult(variant, precision, kind, tolerance, comparison.as_dict())
    limits = vars(tolerance)

    def add(output: str, kind: str, metric: str, value: float, low: float, high: float, unit: str, worse: str, limit: float | None,
            needed: int | None = None) -> None:
        verdict, why = ("reported", "") if limit is None else judge_figure(output, kind, metric, value, low, high, unit, worse, limit,
                                                                              comparison.samples, tolerance.confidence, needed)  # fmt: skip
        result.rows.append({"output": output, "kind": kind, "metric": metric, "value": value, "low": low, "high": high, "unit": unit,
                            "worse": worse, "limit": limit, "verdict": verdict})  # fmt: skip
        if verdict == "fail":
            result.failures.append(why)
        elif verdict == "undecided":
            result.undecided.append(why)

    for name, stats in comparison.outputs.items():
        if name not in kinds or name not in comparison.tasks:  # nothing would judge it: a pass would say nothing
            result.rows.append({"output": name, "kind": None, "metric": "output kind", "value": None, "low": None, "high": None, "unit": "",
                                "worse": "higher", "limit": None, "verdict": "fail"})  # fmt: skip
            result.failures.append(f"output '{name}' has no kind, so no gate judges it (known: {', '.join(sorted(kinds)) or 'none'})")
            continue
        kind = kinds[name].kind
        if stats.nonfinite:
            result.rows.append({"output": name, "kind": kind, "metric": "non-finite values", "value": stats.nonfinite, "low": stats.nonfinite,
                                "high": stats.nonfinite, "unit": "", "worse": "higher", "limit": 0, "verdict": "fail"})  # fmt: skip
            result.failures.append(f"output '{name}' ({kind}): {stats.nonfinite} NaN/Inf values in {stats.nonfinite_samples} samples "
                                   f"where FP32 has finite ones")  # fmt: skip
        for figure in comparison.tasks[name].figures(tolerance.confidence):
            limit = limits[figure.limit_key] if figure.gated else None
            needed = min_samples(limit, tolerance.confidence) if figure.decisions and limit is not None else None
            add(name, kind, figure.metric, figure.value, figure.low, figure.high, figure.unit, figure.worse, limit, needed)
        if tolerance.atol is not None and kind != "regression":
            add(name, kind, "max abs error", stats.max_abs, stats.max_abs, stats.max_abs, "", "higher", tolerance.atol)
    return result


def judge_figure(output: str, kind: str, metric: str, value: float, low: float, high: float, unit: str, worse: str,
                 limit: float, samples: int, confidence: float, needed: int | None = None) -> tuple[str, str]:
    """``("pass" | "fail" | "undecided", why)`` (``why`` empty for a pass) of one figure against its limit: it passes when its
    bound on the worse side is within the limit, fails when the bound on the better side is beyond it.
    ``needed``: the samples on which a perfect result would pass (named when ``samples`` is fewer)."""
    fmt = (lambda x: f"{x:.2f}") if unit == "points" else (lambda x: f"{x:.4g}")
    shown = f"output '{output}' ({kind}): {metric} {fmt(value)}{' points' if unit == 'points' else ''}"
    if not low == high == value:  # a measured maximum (max abs error) has no bounds to show
        shown += f" [{fmt(low)}, {fmt(high)}] ({confidence:.0%} bounds, {samples} samples)"
    bad, good = (high, low) if worse == "higher" else (low, high)
    within = (lambda x: x <= limit) if worse == "higher" else (lambda x: x >= limit)
    sign = ">" if worse == "higher" else "<"
    if within(bad):
        return "pass", ""
    if not within(good):
        return "fail", f"{shown} {sign} {limit:g} allowed"
    what = f"a {limit:g}-point limit" if unit == "points" else f"a limit of {limit:g}"
    short = f"; even a perfect result needs ≥ {needed} samples" if needed is not None and samples < needed else ""
    more = samples_to_decide(value, bad if within(value) else good, limit, samples)
    at_rate = f"; at this {metric}, about {more:,} samples would decide it" if more is not None and not short else ""
    return "undecided", f"not enough evaluation data to judge {what}: {shown}{short}{at_rate}"


def samples_to_decide(value: float, bound: float, limit: float, samples: int) -> int | None:
    """About how many samples would bring ``bound`` (the side of the figure that straddles ``limit``) within ``limit`` if
    ``value`` stayed as it is: bounds narrow as 1/√n, so n · ((bound − value) / (limit − value))². None when the value
    sits on the limit (no number of samples decides it)."""
    if value == limit or bound == limit or samples <= 0 or (bound - value) * (limit - value) <= 0:
        return None  # on the limit, or a bound already at it
    return int(-(-samples * ((bound - value) / (limit - value)) ** 2 // 1))
