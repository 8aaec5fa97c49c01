"""Accuracy through the served endpoint: the labeled evaluation set sent through Triton for every
served variant, beside the in-process numbers of the very file Triton serves.

In-process INT8 numbers use exact Q/DQ semantics (what TensorRT computes). If the server's
runtime took another path (e.g. ONNX Runtime fusing Q/DQ into integer CPU kernels that saturate
on CPUs without VNNI), the served outputs move away from those numbers and the check fails.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from pipeline.artifacts import parse_variant
from pipeline.errors import CheckFailed, PipelineError
from pipeline.evaldata import EvalData
from pipeline.progress import progress
from pipeline.gates import Gates, judge_drop, paired_drop, tolerance_for
from pipeline.tensors import ModelSignature

log = logging.getLogger(__name__)


@dataclass
class ServedResult:
    """One served model: accuracy served and in process, and how far the served outputs are from in-process."""

    model: str
    base: str
    precision: str
    version: int
    samples: int
    served_accuracy: float | None
    inprocess_accuracy: float | None
    top1_agreement: float
    max_abs_diff: float
    failures: list[str]
    notes: list[str] = field(default_factory=list)
    drop_vs_fp32: dict | None = None
    served_right: np.ndarray | None = field(default=None, repr=False)  # per sample, for the paired comparison with FP32


def served_outputs(url: str, model: str, data: EvalData, output: str, batch_size: int) -> list[np.ndarray]:
    """Send every sample through Triton's HTTP endpoint in batches (each of one length bucket, at
    its real size); return ``output`` of each batch."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype

    client = http.InferenceServerClient(url, connection_timeout=10, network_timeout=60)
    chunks = []
    try:
        for batch in data.batches(batch_size):
            inputs = []
            for name, array in batch.items():
                tensor = http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
                tensor.set_data_from_numpy(np.ascontiguousarray(array))
                inputs.append(tensor)
            result = client.infer(model, inputs, outputs=[http.InferRequestedOutput(output)])
            chunks.append(result.as_numpy(output))
    except InferenceServerException as exc:
        raise PipelineError(f"Triton at {url} failed to infer '{model}': {exc.message()}", "check the server log; is the model ready?") from None
    except OSError as exc:
        raise PipelineError(f"cannot reach Triton at {url}: {exc}", "start it with `python -m pipeline serve` or pass the right --url") from None
    finally:
        client.close()
    return chunks


def verify_served_model(
    url: str, model: str, model_file: Path, data: EvalData, signature: ModelSignature, output: str, *, batch_size: int, atol: float
) -> ServedResult:
    """Compare one served model with its own model file run in process (Q/DQ-exact for INT8)."""
    from pipeline.compare import OutputStats
    from pipeline.onnxrt import session_from_onnx

    base, precision = parse_variant(model) or (model, "fp32")
    served = served_outputs(url, model, data, output, batch_size)
    session = session_from_onnx(model_file, exact_qdq=precision == "int8")
    local = [session.run([output], batch)[0] for batch in data.batches(batch_size)]
    stats = OutputStats()
    for mine, theirs in zip(local, served, strict=True):
        stats.add(mine, theirs)
    # Batches of different length buckets may differ beyond the batch axis: compare batch by batch.
    served_top1, local_top1 = [s.argmax(-1) for s in served], [m.argmax(-1) for m in local]
    agree = sum(int((s == m).sum()) for s, m in zip(served_top1, local_top1)) / max(sum(s.size for s in served_top1), 1)
    labels = data.labels if all(s.ndim == 1 for s in served_top1) else None
    if labels is not None:
        served_top1, local_top1 = np.concatenate(served_top1), np.concatenate(local_top1)
    failures = []
    if stats.max_abs > atol:
        failures.append(f"served outputs differ from in-process by up to {stats.max_abs:.3g} (> {atol:g})")
    return ServedResult(
        model=model,
        base=base,
        precision=precision,
        version=int(model_file.parent.name),
        samples=sum(len(s) for s in served),
        served_accuracy=None if labels is None else float((served_top1 == labels).mean()),
        inprocess_accuracy=None if labels is None else float((local_top1 == labels).mean()),
        top1_agreement=float(agree),
        max_abs_diff=stats.max_abs,
        failures=failures,
        served_right=None if labels is None else served_top1 == labels,
    )


def gate_against_fp32(results: Sequence[ServedResult], gates: Gates) -> None:
    """Each served variant's accuracy against served FP32 on the same samples, judged as the build's gate
    (pipeline.gates): a drop beyond the limit fails; a set too small to decide is noted (the build judged it)."""
    fp32 = {r.base: r for r in results if r.precision == "fp32"}
    for result in results:
        ref = fp32.get(result.base)
        if ref is None or result is ref or result.served_right is None or ref.served_right is None:
            continue
        tolerance = tolerance_for(result.precision, gates)
        worse = int((ref.served_right & ~result.served_right).sum())
        better = int((~ref.served_right & result.served_right).sum())
        estimate = paired_drop(worse, better, result.samples, tolerance.confidence)
        result.drop_vs_fp32 = estimate.as_dict()
        verdict, why = judge_drop(estimate, tolerance.max_drop_points)
        if verdict == "fail":
            result.failures.append(f"served vs served FP32: {why}")
        elif verdict == "undecided":
            result.notes.append(f"served vs served FP32: {why}")


def results_as_json(results: Sequence[ServedResult]) -> list[dict]:
    """The report rows (per-sample arrays left out)."""
    return [{k: v for k, v in asdict(r).items() if k != "served_right"} | {"passed": not r.failures} for r in results]


def verify_repository(
    repository: Path,
    *,
    url: str | None,
    models: Sequence[str],
    calibration_root: Path,
    batch_size: int,
    atol: float,
    gates: Gates,
    report_path: Path,
    eval_data: Mapping[str, EvalData | Path] | None = None,
    show: Callable[[list[dict]], None] | None = None,
) -> dict:
    """Verify the pipeline's ONNX variants in ``repository`` through Triton at ``url`` (None: the
    embedded server on ``repository``); write ``report_path``; raise CheckFailed when a served check fails.

    Each model's data: ``eval_data[base model]`` (an EvalData or an .npz), else what its build
    recorded, else ``<calibration-root>/<base>/eval.npz``. A model without any is reported and skipped.
    """
    from pipeline.evaldata import eval_data_from_path
    from pipeline.gates import classifier_output
    from pipeline.tensors import signature_from_onnx
    from pipeline.triton.repository import read_repository
    from pipeline.triton.server import TritonServer
    from pipeline.workspace import eval_data_of_served

    chosen = {}
    for name, model in sorted(read_repository(repository).items()):
        if models and name not in models:
            continue
        if model.config.platform != "onnxruntime_onnx" or parse_variant(name) is None:
            log.info("%s: not verified here (%s)", name, model.config.platform or model.config.backend)
            continue
        chosen[name] = model
    missing = sorted(set(models) - set(chosen))
    if missing or not chosen:
        raise PipelineError(f"no servable pipeline ONNX model named {missing or 'any'} in {repository}", "run `python -m pipeline build` or check --model")

    planned: dict[str, tuple] = {}
    skipped: dict[str, str] = {}
    for name, model in chosen.items():
        base, _ = parse_variant(name)  # type: ignore[misc]
        version = max(model.versions)
        model_file = model.path / str(version) / (model.config.default_model_filename or "model.onnx")
        signature = signature_from_onnx(model_file)
        given = (eval_data or {}).get(base)
        source = given if given is not None else eval_data_of_served(model.path, calibration_root)
        if source is None:
            skipped[name] = f"no evaluation data (none recorded by its build, no {calibration_root / base / 'eval.npz'}): pass --eval-data"
            log.warning("%s: skipped, %s", name, skipped[name])
            continue
        data = source if isinstance(source, EvalData) else eval_data_from_path(Path(source), signature)
        planned[name] = (version, model_file, signature, data, min(batch_size, model.config.max_batch_size or batch_size))
    if not planned:
        raise PipelineError(f"no evaluation data for any of {sorted(chosen)}", "pass --eval-data PATH.npz (one array per input name, plus labels)")

    server = None if url else TritonServer(repository)
    results = []
    with server if server else contextlib.nullcontext(), progress("served verification", len(planned), unit="models") as bar:
        endpoint = url or server.http_url  # type: ignore[union-attr]
        for name, (version, model_file, signature, data, batch) in bar.track(planned.items()):
            bar.note(name)
            output = classifier_output(signature) or signature.outputs[0].name
            log.info("verifying %s v%d through %s (%d samples from %s)", name, version, endpoint, data.num_samples, data.source)
            results.append(verify_served_model(endpoint, name, model_file, data, signature, output, batch_size=batch, atol=atol))
    gate_against_fp32(results, gates)

    report = {"url": url or "embedded", "repository": str(repository), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "models": results_as_json(results), "skipped": skipped}
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    if show:
        show(report["models"])
    failed = [r for r in results if r.failures]
    if failed:
        raise CheckFailed(
            "served accuracy check failed: " + "; ".join(f"{r.model}: {', '.join(r.failures)}" for r in failed) + f" (report: {report_path})",
            "for INT8, make sure the server keeps Q/DQ exact (optimization graph level 2 in config.pbtxt)",
        )
    return report
