"""How one variant's comparison with FP32 is judged, output by output: the verdict the build's
accuracy stage and ``verify``'s served gate both give (figures: pipeline.taskstats; limits and
bounds: pipeline.gates)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeline.compare import Comparison
from pipeline.gates import Tolerance, judge_figure
from pipeline.outputkinds import OutputKind


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

    def add(output: str, kind: str, metric: str, value: float, low: float, high: float, unit: str, worse: str, limit: float | None) -> None:
        verdict, why = ("reported", None) if limit is None else judge_figure(output, kind, metric, value, low, high, unit, worse, limit,
                                                                              comparison.samples, tolerance.confidence)  # fmt: skip
        result.rows.append({"output": output, "kind": kind, "metric": metric, "value": value, "low": low, "high": high, "unit": unit,
                            "worse": worse, "limit": limit, "verdict": verdict})  # fmt: skip
        if verdict == "fail":
            result.failures.append(why or "")
        elif verdict == "undecided":
            result.undecided.append(why or "")

    for name, stats in comparison.outputs.items():
        kind = kinds[name].kind if name in kinds else "regression"
        if stats.nonfinite:
            result.rows.append({"output": name, "kind": kind, "metric": "non-finite values", "value": stats.nonfinite, "low": stats.nonfinite,
                                "high": stats.nonfinite, "unit": "", "worse": "higher", "limit": 0, "verdict": "fail"})  # fmt: skip
            result.failures.append(f"output '{name}' ({kind}): {stats.nonfinite} NaN/Inf values in {stats.nonfinite_samples} samples "
                                   f"where FP32 has finite ones")  # fmt: skip
        task = comparison.tasks.get(name)
        for figure in task.figures(tolerance.confidence) if task else []:
            add(name, kind, figure.metric, figure.value, figure.low, figure.high, figure.unit, figure.worse,
                limits[figure.limit_key] if figure.gated else None)
        if tolerance.atol is not None and kind != "regression":
            add(name, kind, "max abs error", stats.max_abs, stats.max_abs, stats.max_abs, "", "higher", tolerance.atol)
    return result
