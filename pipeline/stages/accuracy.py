"""Accuracy gates: every precision variant against the FP32 ONNX model, on labeled data.

INT8 Q/DQ models are evaluated with Q/DQ semantics (quantize → dequantize in float around FP32
kernels, what TensorRT computes), never through ONNX Runtime's fused integer CPU kernels, so
the gate predicts the engine and not a quirk of this CPU. Engines, where built, run through
Polygraphy's TrtRunner against the same reference and gates.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from polygraphy.backend.base import BaseRunner

from pipeline.artifacts import Artifact
from pipeline.compare import Comparison, compare_runners
from pipeline.config import Gates
from pipeline.errors import CheckFailed
from pipeline.evaldata import EvalData
from pipeline.progress import progress
from pipeline.runners import runner_for_onnx
from pipeline.tensors import ModelSignature


@dataclass
class Gate:
    """The tolerances one variant is held to."""

    max_drop_points: float
    atol: float | None


@dataclass
class VariantResult:
    variant: str
    precision: str
    kind: str
    gate: Gate
    comparison: dict
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def gate_for(artifact: Artifact, gates: Gates) -> Gate:
    """INT8 has its own gate; FP16 and FP32 engines (TF32 may be used) share the FP16 gate."""
    if artifact.precision == "int8":
        return Gate(gates.int8_max_drop, gates.int8_atol)
    return Gate(gates.fp16_max_drop, gates.fp16_atol)


def classifier_output(signature: ModelSignature) -> str | None:
    """The first output shaped [batch, classes] (classes > 1): its argmax is the predicted class."""
    for spec in signature.outputs:
        if len(spec.shape) == 2 and isinstance(spec.shape[1], int) and spec.shape[1] > 1 and spec.dtype.kind == "f":
            return spec.name
    return None


def runner_for_artifact(artifact: Artifact) -> BaseRunner:
    """A Polygraphy runner for an ONNX variant (Q/DQ-exact for INT8) or a TensorRT plan."""
    name = f"{artifact.precision}-{artifact.kind}"
    if artifact.kind == "plan":
        from pipeline.stages.engine import runner_for_engine

        runner = runner_for_engine(artifact.path)
        runner.name = name
        return runner
    return runner_for_onnx(artifact.path, exact_qdq=artifact.precision == "int8", name=name)


def accuracy_report_from_variants(
    fp32_onnx: Path,
    candidates: Sequence[Artifact],
    data: EvalData,
    dst: Path,
    *,
    gates: Gates,
    signature: ModelSignature,
    batch_size: int,
) -> list[VariantResult]:
    """Compare every candidate with the FP32 ONNX model on ``data``; write ``dst`` (JSON);
    raise CheckFailed naming each variant that fails its gate and by how much."""
    output = classifier_output(signature)
    reference = runner_for_onnx(fp32_onnx, name="fp32-onnx")
    with progress("accuracy gates", -(-data.num_samples // batch_size), unit="batches") as bar:
        comparisons = compare_runners(
            reference, [runner_for_artifact(a) for a in candidates], bar.track(data.batches(batch_size)), labels=data.labels, classifier_output=output
        )
    results = [_judge(a, c, gate_for(a, gates)) for a, c in zip(candidates, comparisons)]
    report = {
        "reference": "fp32-onnx (ONNX Runtime CPU)",
        "data": data.source,
        "samples": data.num_samples,
        "labels": data.labels is not None,
        "classifier_output": output,
        "int8_semantics": "Q/DQ evaluated exactly (ONNX Runtime with graph optimizations off), as TensorRT computes them",
        "variants": [
            {"variant": r.variant, "precision": r.precision, "kind": r.kind, "passed": r.passed, "failures": r.failures, "gate": vars(r.gate), **r.comparison}
            for r in results
        ],
    }
    dst.write_text(json.dumps(report, indent=2) + "\n")
    failed = [r for r in results if not r.passed]
    if failed:
        fixes = []
        if any(r.precision == "int8" for r in failed):
            fixes.append("for INT8 try --calibration-method entropy or percentile or more calibration data, or loosen --int8-max-drop")
        if any(r.precision != "int8" for r in failed):
            fixes.append("for FP16 loosen --fp16-atol / --fp16-max-drop if the error is acceptable, or build without --fp16")
        raise CheckFailed(
            "accuracy gate failed: " + "; ".join(f"{r.variant}: {', '.join(r.failures)}" for r in failed) + f" (report: {dst})",
            "; ".join(fixes),
        )
    return results


def _judge(artifact: Artifact, comparison: Comparison, gate: Gate) -> VariantResult:
    name = f"{artifact.precision}-{artifact.kind}"
    failures = []
    if comparison.accuracy is not None and comparison.reference_accuracy is not None:
        drop = (comparison.reference_accuracy - comparison.accuracy) * 100
        if drop > gate.max_drop_points:
            failures.append(
                f"top-1 accuracy {comparison.accuracy:.2%} vs FP32 {comparison.reference_accuracy:.2%}, "
                f"drop {drop:.2f} points > {gate.max_drop_points:g} allowed"
            )
    elif comparison.top1_agreement is not None:
        # Without labels, disagreement with FP32 stands in for the accuracy drop (an upper bound on it).
        disagreement = (1 - comparison.top1_agreement) * 100
        if disagreement > gate.max_drop_points:
            failures.append(f"top-1 disagrees with FP32 on {disagreement:.2f}% of samples > {gate.max_drop_points:g} allowed")
    if gate.atol is not None:
        for out, stats in comparison.outputs.items():
            if stats.max_abs > gate.atol:
                failures.append(f"output '{out}' max abs error {stats.max_abs:.3g} > atol {gate.atol:g}")
    return VariantResult(name, artifact.precision, artifact.kind, gate, comparison.as_dict(), failures)
