"""The parity gate: the ONNX model must compute what TensorFlow computes, on real samples.

The gate runs in a child process (pipeline/core/isolate.py): TensorFlow's loaded SavedModel and its
allocator leave with it, instead of staying in the build process (about 1.2 GB for ResNet50)
underneath the INT8 calibration and the accuracy gates that follow.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.accuracy.compare import Comparison, compare_runners
from pipeline.accuracy.evaldata import EvalData
from pipeline.backend.runners import SavedModelRunner, runner_for_onnx
from pipeline.core.errors import CheckFailed
from pipeline.core.progress import progress


def parity_report_from_models(saved: Path, onnx_path: Path, data: EvalData, dst: Path, *, atol: float, rtol: float, batch_size: int,
                              reference_format: str = "float32", ulps: float = 0.0, kinds: list[dict] | None = None) -> Path:
    """Run the SavedModel (TF) and the ONNX model (ONNX Runtime) on ``data``; write per-output
    max abs/rel differences to ``dst`` (JSON) and raise if any element differs by more than
    ``atol + rtol·|tf|`` (plus, when TensorFlow computes in ``reference_format`` float16, ``ulps`` of its spacing at
    each sample's largest value); with ``kinds`` (JSON of output kinds) each class output's top-1 agreement beside.
    Runs in a child process, so TensorFlow does not stay in this one."""
    from pipeline.core.isolate import call_in_child

    return call_in_child(_parity_report, saved, onnx_path, data, dst, atol=atol, rtol=rtol, batch_size=batch_size,
                         reference_format=reference_format, ulps=ulps, kinds=kinds)


def _parity_report(saved: Path, onnx_path: Path, data: EvalData, dst: Path, *, atol: float, rtol: float, batch_size: int,
                   reference_format: str, ulps: float, kinds: list[dict] | None) -> Path:
    from pipeline.accuracy.outputkinds import kinds_from_json

    classes = {name: kind for name, kind in kinds_from_json(kinds or []).items() if kind.kind == "classes"}
    tf_runner = SavedModelRunner(saved, name="tensorflow")
    ort_runner = runner_for_onnx(onnx_path, name="onnxruntime")
    with progress("parity TensorFlow vs ONNX", data.num_batches(batch_size), unit="batches") as bar:
        [comparison] = compare_runners(tf_runner, [ort_runner], bar.track(data.batches(batch_size)), kinds=classes, tolerance=(atol, rtol),
                                       reference_format=reference_format, ulps=ulps)
    failures = parity_failures(comparison)
    report = {
        "reference": f"tensorflow (SavedModel serving_default, computing in {reference_format})",
        "candidate": "onnxruntime (CPU, FP32)",
        "data": data.source,
        "samples": comparison.samples,
        "tolerance": {"atol": atol, "rtol": rtol} | ({"reference_format": reference_format, "ulps": ulps} if reference_format != "float32" else {}),
        "outputs": {k: vars(v) | {"top1_agreement": comparison.summary(k).get("agreement")} for k, v in comparison.outputs.items()},
        "passed": not failures,
    }
    dst.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if failures:
        raise CheckFailed(
            f"ONNX model differs from TensorFlow: {'; '.join(failures)} (report: {dst})",
            "the conversion is wrong for this model; raise --parity-atol, --parity-rtol or --parity-ulps only if the difference is acceptable",
        )
    return dst


def parity_failures(comparison: Comparison) -> list[str]:
    """Why ONNX (the candidate of ``comparison``, compared with a tolerance) differs from TensorFlow: a NaN/Inf
    where TensorFlow is finite, or values farther from TensorFlow's than ``atol + rtol·|TensorFlow|``."""
    failures = []
    for name, stats in comparison.outputs.items():
        if stats.nonfinite:
            failures.append(f"output '{name}' has {stats.nonfinite} NaN/Inf values in {stats.nonfinite_samples} samples where TensorFlow's are finite")
        if stats.beyond and stats.tolerance:
            atol, rtol = stats.tolerance
            narrow = (f" + {stats.ulps:g} {stats.reference_format} spacings at the sample's largest |value| (TensorFlow computes in "
                      f"{stats.reference_format})") if stats.ulps and stats.reference_format != "float32" else ""
            agreement = comparison.summary(name).get("agreement")
            top1 = f", top-1 agreement {100 * agreement:.2f}%" if agreement is not None else ""
            failures.append(f"output '{name}' has {stats.beyond} of {stats.elements} values farther than atol {atol:g} + rtol {rtol:g}·|TensorFlow|"
                            f"{narrow} (max abs diff {stats.max_abs:.3g}{top1})")
    return failures
