"""The served checks' verdicts, on arrays: each served output against the same file run in process
(:func:`served_against_inprocess`), and each served variant against served FP32, judged by kind as
the build's gate (:func:`gate_against_fp32`). pipeline.triton.verify gets the arrays from Triton.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from pipeline.accuracy.compare import Comparison, new_comparison
from pipeline.accuracy.gates import Gates, tolerance_for
from pipeline.accuracy.judging import judge_comparison
from pipeline.accuracy.outputkinds import OutputKind

SERVED_ATOL = 1e-3  # max abs difference served vs in process (verify --atol, build --verify-served)
AGAINST_FP32 = "served vs served FP32: "  # how a failure of the judgement against served FP32 starts
MLPERF_TARGET = "MLPerf accuracy target: "  # how a failure of --accuracy-target starts

@dataclass
class ServedResult:
    """One served model: every output served against the same file in process, and its gates against served FP32."""

    model: str
    base: str
    precision: str
    version: int
    samples: int
    outputs: dict[str, dict]  # per output: kind, max abs served vs in-process, NaN/Inf, served and in-process task metric
    failures: list[str]
    notes: list[str] = field(default_factory=list)
    gates: list[dict] = field(default_factory=list)  # each output's figures against served FP32 (pipeline.accuracy.judging)
    kinds: dict[str, OutputKind] = field(default_factory=dict, repr=False)
    served: list[dict[str, np.ndarray]] = field(default_factory=list, repr=False)  # per batch, for the comparison with FP32
    targets: list[dict[str, np.ndarray]] = field(default_factory=list, repr=False)  # the labels of those batches
    # Served FP32 on this variant's own input values where they are not the evaluation samples (a uint8-input
    # variant gets them rounded to its wire format): what it is judged against instead of FP32's own batches.
    fp32_on_same_values: list[dict[str, np.ndarray]] | None = field(default=None, repr=False)


def served_against_inprocess(comparison: Comparison, kinds: Mapping[str, OutputKind], atol: float) -> tuple[dict[str, dict], list[str]]:
    """Per output of ``comparison`` (in process as the reference, served as the candidate): its row
    (kind, max abs difference, NaN/Inf, served and in-process task metric) and the failures: a NaN or
    ±Inf served where the in-process value is finite, or a difference beyond ``atol``."""
    failures, outputs = [], {}
    for name, stats in comparison.outputs.items():
        summary = comparison.summary(name)
        outputs[name] = {"kind": kinds[name].kind, "max_abs_diff": stats.max_abs, "nonfinite": stats.nonfinite, "agreement": summary.get("agreement"),
                         "served_metric": summary.get("accuracy"), "inprocess_metric": summary.get("reference_accuracy")}  # fmt: skip
        if stats.nonfinite:
            failures.append(f"output '{name}': {stats.nonfinite} NaN/Inf values served where in-process ones are finite")
        if stats.max_abs > atol:
            failures.append(f"output '{name}' served differs from in-process by up to {stats.max_abs:.3g} (> {atol:g})")
    return outputs, failures


def gate_against_fp32(results: Sequence[ServedResult], gates: Mapping[str, Gates]) -> None:
    """Each served variant against served FP32 on the same samples, every output judged by its kind as the
    build's gate (pipeline.accuracy.judging): a failure fails; a set too small to decide is noted (the build judged it)."""
    fp32 = {r.base: r for r in results if r.precision == "fp32"}
    for result in results:
        ref = fp32.get(result.base)
        if ref is None or result is ref:
            continue
        tolerance = tolerance_for(result.precision, gates[result.model])
        comparison = new_comparison(result.model, result.kinds, tolerance.threshold)
        reference = ref.served if result.fp32_on_same_values is None else result.fp32_on_same_values
        if len(reference) != len(result.served):
            result.notes.append("served vs served FP32: not compared (the two were verified on different data)")
            continue
        for theirs, mine, target in zip(reference, result.served, result.targets, strict=True):
            comparison.add(theirs, mine, target)
        verdict = judge_comparison(result.model, result.precision, "served", comparison, tolerance, result.kinds)
        result.gates = verdict.rows
        result.failures += [f"{AGAINST_FP32}{why}" for why in verdict.failures]
        result.notes += [f"{AGAINST_FP32}{why}" for why in verdict.undecided]


def against_share_of_fp32(results: Sequence[ServedResult], share: float) -> None:
    """MLPerf's accuracy rule: each variant's task metric against the labels (accuracy, R², mIoU: higher is better) at
    least ``share`` (0.99, 0.999) of served FP32's on the same samples. A row per output beside the gates, a failure
    where it falls short; an output without labels has no such metric, which a note says. Unlike the gates it is a
    point figure, as MLPerf states it: no confidence bounds."""
    fp32 = {r.base: r for r in results if r.precision == "fp32"}
    for result in results:
        ref = fp32.get(result.base)
        if result is ref:
            continue
        if ref is None or ref.samples != result.samples:
            why = f"no served {result.base}_fp32 verified beside it" if ref is None else "served FP32 was verified on other samples"
            result.notes.append(f"{MLPERF_TARGET}not stated: {why}; verify both on the same data")
            continue
        for name, row in result.outputs.items():
            mine, theirs = row.get("served_metric"), ref.outputs.get(name, {}).get("served_metric")
            if mine is None or theirs is None:
                result.notes.append(f"{MLPERF_TARGET}output '{name}': no labels, so no task metric to hold to {share:.1%} of FP32's")
                continue
            required = theirs - (1 - share) * abs(theirs)  # share × FP32's for the positive metrics MLPerf states it for
            verdict = "pass" if mine >= required - 1e-12 * max(1.0, abs(theirs)) else "fail"  # exactly the share passes
            result.gates.append({"output": name, "kind": row["kind"], "metric": f"MLPerf target ({share:.1%} of FP32's)", "value": mine,
                                 "low": mine, "high": mine, "unit": "", "worse": "lower", "limit": required, "verdict": verdict, "fp32": theirs})
            if verdict == "fail":
                result.failures.append(f"{MLPERF_TARGET}output '{name}' ({row['kind']}): {mine:.4f} < {share:.1%} of served FP32's "
                                       f"{theirs:.4f} ({required:.4f})")


def results_as_json(results: Sequence[ServedResult]) -> list[dict]:
    """The report rows (served outputs and kinds left out)."""
    hidden = ("served", "targets", "kinds", "fp32_on_same_values")
    return [{f.name: getattr(r, f.name) for f in fields(r) if f.name not in hidden} | {"passed": not r.failures} for r in results]
