"""Accuracy gates: every precision variant against the FP32 ONNX model, on the evaluation data.

INT8 Q/DQ models are evaluated with Q/DQ semantics (quantize → dequantize in float around FP32
kernels, what TensorRT computes), never through ONNX Runtime's fused integer CPU kernels, so
the gate predicts the engine and not a quirk of this CPU. Engines, where built, run through
Polygraphy's TrtRunner against the same reference and gates. How a variant is judged (the drop
with its confidence bounds per output kind) is pipeline.accuracy.judging, what each kind measures
pipeline.accuracy.taskstats.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polygraphy.backend.base import BaseRunner

from pipeline.accuracy.compare import compare_runners
from pipeline.accuracy.evaldata import EvalData
from pipeline.accuracy.gates import Gates, tolerance_for
from pipeline.accuracy.judging import VariantResult, judge_comparison
from pipeline.accuracy.outputkinds import OutputKind, kinds_from_json
from pipeline.backend.plan_runner import plan_max_batch, plan_profiles, runner_for_plan
from pipeline.backend.runners import runner_for_onnx
from pipeline.backend.trt_seam import TensorRT
from pipeline.core.errors import CheckFailed, PipelineError
from pipeline.core.progress import progress
from pipeline.data.artifacts import Artifact
from pipeline.stages.engine import metadata_path, read_engine_metadata
from pipeline.stages.layer_errors import LayerError, describe, layer_errors_from_models

log = logging.getLogger(__name__)


def runner_for_artifact(artifact: Artifact, tensorrt: TensorRT | None = None, allow_host_code: bool = False) -> BaseRunner:
    """A Polygraphy runner for an ONNX variant (Q/DQ-exact for INT8) or a TensorRT plan (through the
    ``tensorrt`` seam, switching to the profile that admits each batch)."""
    name = f"{artifact.precision}-{artifact.kind}"
    if artifact.kind == "plan":
        if tensorrt is None:
            raise PipelineError(f"{artifact.path} is a TensorRT plan but no TensorRT was given to run it", "pass the build's tensorrt")
        return runner_for_plan(artifact.path, _plan_metadata(artifact), tensorrt=tensorrt, allow_host_code=allow_host_code, name=name)
    # The CPU INT8 variant runs with ORT's graph optimizations on, as it is served (pipeline.stages.int8_cpu).
    return runner_for_onnx(artifact.path, exact_qdq=artifact.precision == "int8", name=name)


def _plan_metadata(artifact: Artifact) -> dict[str, Any]:
    return read_engine_metadata(artifact.metadata or metadata_path(artifact.path))


def gate_batch(candidates: Sequence[Artifact], batch_size: int) -> int:
    """``batch_size``, capped to the largest batch every plan's every profile admits (TensorRT refuses larger)."""
    caps = [plan_max_batch(plan_profiles(_plan_metadata(a))) for a in candidates if a.kind == "plan"]
    return min([batch_size, *(c for c in caps if c is not None)])


def accuracy_report_from_variants(
    fp32_onnx: Path,
    candidates: Sequence[Artifact],
    data: EvalData,
    dst: Path,
    *,
    gates: Gates,
    kinds: Sequence[Mapping[str, Any]],
    batch_size: int,
    tf32: bool = True,
    allow_host_code: bool = False,
    tensorrt: TensorRT | None = None,
    optional: Sequence[str] = (),
    fallback: Mapping[str, str] | None = None,
) -> list[VariantResult]:
    """Compare every candidate with the FP32 ONNX model on ``data``, every output by its kind
    (``kinds``: pipeline.accuracy.outputkinds JSON form); write ``dst`` (JSON); raise PipelineError naming
    each variant, output and figure that fails its gate (or that the data cannot judge).

    Plans run through ``tensorrt`` in batches their profiles admit; ``tf32`` (how the FP32 plan was
    built) picks the FP32 plan's tolerance (:func:`pipeline.accuracy.gates.tolerance_for`). ONNX variants of an ``optional``
    precision (one the user did not ask for) that do not pass are marked ``left_out`` in the report instead of raising:
    the build leaves them out. ``fallback`` (precision → what the INT8 fallback did, one line) goes with that variant's
    row and into the failure, so the line names the sets it tried and the samples it used."""
    by_name = kinds_from_json(kinds)
    batch_size = gate_batch(candidates, batch_size)
    reference = runner_for_onnx(fp32_onnx, name="fp32-onnx")
    runners = [runner_for_artifact(a, tensorrt, allow_host_code) for a in candidates]
    with progress("accuracy gates", data.num_batches(batch_size), unit="batches") as bar:
        comparisons = compare_runners(reference, runners, bar.track(data.batches(batch_size)),
                                      kinds=by_name, targets=data.target_batches(batch_size), threshold=gates.binary_threshold)  # fmt: skip
    results = [judge_comparison(f"{a.precision}-{a.kind}", a.precision, a.kind, c,
                                tolerance_for(a.precision, gates, engine=a.kind == "plan", tf32=tf32), by_name)
               for a, c in zip(candidates, comparisons)]
    layers = {r.variant: _int8_layer_errors(fp32_onnx, a, data) for a, r in zip(candidates, results) if r.failures and a.precision == "int8" and a.kind == "onnx"}
    report = {
        "reference": "fp32-onnx (ONNX Runtime CPU)",
        "data": data.source,
        "samples": data.num_samples,
        "batch_size": batch_size,
        "labels": data.target_names,
        "output_kinds": list(kinds),
        "int8_semantics": "Q/DQ evaluated exactly (ONNX Runtime with graph optimizations off), as TensorRT computes them",
        "tf32": tf32,
        "variants": [
            {"variant": r.variant, "precision": r.precision, "kind": r.kind, "passed": r.passed, "undecided": bool(r.undecided) and not r.failures,
             "left_out": _left_out(r, optional),
             "failures": r.failures + r.undecided, "gate": vars(r.tolerance), "gates": r.rows, **r.comparison, **_primary(r, by_name),
             **({"layers": [e.as_dict() for e in layers[r.variant]], "layers_summary": describe(layers[r.variant])} if r.variant in layers else {}),
             **({"fallback": (fallback or {})[r.precision]} if r.kind == "onnx" and r.precision in (fallback or {}) else {})}
            for r in results
        ],
    }
    dst.write_text(json.dumps(report, indent=2) + "\n")
    raise_for_failures([r for r in results if not _left_out(r, optional)], dst, {variant: describe(errors) for variant, errors in layers.items()},
                       {f"{p}-onnx": line for p, line in (fallback or {}).items()})
    return results


def _left_out(result: VariantResult, optional: Sequence[str]) -> bool:
    return not result.passed and result.kind == "onnx" and result.precision in optional


def judge_variant(fp32_onnx: Path, candidate: Artifact, data: EvalData, *, gates: Gates, kinds: Mapping[str, OutputKind],
                  batch_size: int) -> VariantResult:
    """One ONNX variant against the FP32 ONNX model on ``data``, judged as the accuracy stage judges it (no report, no raise)."""
    reference = runner_for_onnx(fp32_onnx, name="fp32-onnx")
    [comparison] = compare_runners(reference, [runner_for_artifact(candidate)], data.batches(batch_size), kinds=kinds,
                                   targets=data.target_batches(batch_size), threshold=gates.binary_threshold)
    return judge_comparison(f"{candidate.precision}-{candidate.kind}", candidate.precision, candidate.kind, comparison,
                            tolerance_for(candidate.precision, gates), kinds)


# What each kind's "accuracy" is (pipeline/accuracy/taskstats.py), so a table can name it: an R² of -5% is not an accuracy.
ACCURACY_METRICS = {"classes": "top-1", "binary": "accuracy", "multilabel": "label accuracy", "regression": "R²", "segmentation": "mIoU"}


def _primary(result: VariantResult, kinds: Mapping[str, OutputKind]) -> dict[str, Any]:
    """The first output's task summary (accuracy, FP32's, agreement), for one-number tables and tune."""
    for name in kinds:
        summary = result.comparison["outputs"].get(name, {})
        if summary.get("accuracy") is not None or summary.get("agreement") is not None:
            return {"primary_output": name, "accuracy": summary.get("accuracy"), "reference_accuracy": summary.get("reference_accuracy"),
                    "accuracy_metric": ACCURACY_METRICS.get(kinds[name].kind), "agreement": summary.get("agreement")}
    return {"primary_output": None, "accuracy": None, "reference_accuracy": None, "accuracy_metric": None, "agreement": None}


LAYER_ERROR_SAMPLES = 32


def _int8_layer_errors(fp32_onnx: Path, artifact: Artifact, data: EvalData) -> list[LayerError]:
    """Per-layer INT8 error on the first evaluation samples (a failed INT8 gate says where it comes from)."""
    feed = data.head(LAYER_ERROR_SAMPLES)
    errors = layer_errors_from_models(fp32_onnx, artifact.path, feed)
    log.info("%s: %s", artifact.path.name, describe(errors))
    return errors


def raise_for_failures(results: Sequence[VariantResult], report: Path, layer_notes: Mapping[str, str] | None = None,
                       fallback_notes: Mapping[str, str] | None = None) -> None:
    """One error naming every variant that failed or could not be judged, with the fixes: CheckFailed (exit 1) either
    way, a gate's verdict, not a usage error (an undecided gate names the samples that would decide it).
    ``layer_notes`` (variant → where its INT8 error comes from) are added to the fixes, ``fallback_notes`` (variant →
    what the INT8 fallback tried) to that variant's failure."""
    failed = [r for r in results if not r.passed]
    if not failed:
        return
    fixes = []
    if any(r.undecided for r in failed):
        fixes.append("give more labeled samples with --eval-data, or a looser --fp16-max-drop/--int8-max-drop")
    if any(r.failures and r.precision.startswith("int8") for r in failed):
        notes = [f"{variant}: {note}" for variant, note in (layer_notes or {}).items()]
        fixes.append("; ".join(notes) if notes else "for INT8 keep the layers that add the most error in float (--int8-keep-nodes)")
        fixes.append("or let the fallback keep more of them (--int8-fallback-max-share)")
        fixes.append("or try --calibration-method entropy or more calibration data, or loosen --int8-max-drop")
    if any(r.failures and r.precision == "int8cpu" for r in failed):
        fixes.append("or leave the CPU INT8 out with --no-int8-cpu")
    if any(r.failures and not r.precision.startswith("int8") for r in failed):
        fixes.append("for FP16 keep sensitive ops in FP32 (--fp16-keep-op-types) or loosen --fp16-atol / --fp16-max-drop if the error is acceptable")
    kind = "accuracy gate failed" if any(r.failures for r in failed) else "accuracy gate undecided"
    fell_back = fallback_notes or {}
    raise CheckFailed(
        f"{kind}: " + "; ".join(f"{r.variant}: {', '.join(r.failures + r.undecided)}"
                                + (f" — {fell_back[r.variant]}" if r.variant in fell_back else "") for r in failed) + f" (report: {report})",
        "; ".join(fixes),
    )
