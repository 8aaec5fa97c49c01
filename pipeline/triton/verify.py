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
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.accuracy.evaldata import EvalData
from pipeline.accuracy.gates import Gates
from pipeline.accuracy.outputkinds import OutputKind
from pipeline.backend.trt_seam import PolygraphyTensorRT, TensorRT
from pipeline.core.errors import CheckFailed, PipelineError
from pipeline.core.objectstore import S3Url
from pipeline.core.progress import progress
from pipeline.data.artifacts import WIRE_PRECISIONS, parse_variant
from pipeline.triton.served_gate import (
    AGAINST_FP32,
    MLPERF_TARGET,
    ServedResult,
    against_share_of_fp32,
    gate_against_fp32,
    results_as_json,
    served_against_inprocess,
)

log = logging.getLogger(__name__)

# How the served outputs are fetched: (url, model, data, outputs, batch size) → every output per batch of ``data``
# at that batch size. :func:`served_outputs` (tritonclient, batch after batch) by default; ``loadtest --mode
# accuracy`` gives LoadGen's accuracy log instead.
Collect = Callable[[str, str, EvalData, Sequence[str], int], list[dict[str, np.ndarray]]]


def served_outputs(url: str, model: str, data: EvalData, outputs: Sequence[str], batch_size: int) -> list[dict[str, np.ndarray]]:
    """Send every sample through Triton's HTTP endpoint in batches (each of one length bucket, at
    its real size); return every one of ``outputs`` of each batch."""
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
            result = client.infer(model, inputs, outputs=[http.InferRequestedOutput(o) for o in outputs])
            chunks.append({o: result.as_numpy(o) for o in outputs})
    except InferenceServerException as exc:
        raise PipelineError(f"Triton at {url} failed to infer '{model}': {exc.message()}", "check the server log; is the model ready?") from None
    except OSError as exc:
        raise PipelineError(f"cannot reach Triton at {url}: {exc}", "start it with `python -m pipeline serve` or pass the right --url") from None
    finally:
        client.close()
    return chunks


def served_against_file(
    model: str, model_file: Path, data: EvalData, kinds: Mapping[str, OutputKind], served: list[dict[str, np.ndarray]], *, batch_size: int,
    atol: float, threshold: float,
) -> ServedResult:
    """What Triton served for ``model`` (``served``: every output, per batch of ``data`` at ``batch_size``) against its own
    model file run in process (Q/DQ-exact for INT8)."""
    from pipeline.accuracy.compare import new_comparison
    from pipeline.backend.onnxrt import session_from_onnx

    base, precision = parse_variant(model) or (model, "fp32")
    session = session_from_onnx(model_file, exact_qdq=precision == "int8")
    comparison = new_comparison(model, kinds, threshold)
    for batch, theirs, target in zip(data.batches(batch_size), served, data.target_batches(batch_size), strict=True):
        comparison.add(dict(zip(list(kinds), session.run(list(kinds), batch))), theirs, target)
    outputs, failures = served_against_inprocess(comparison, kinds, atol)
    return ServedResult(model, base, precision, int(model_file.parent.name), comparison.samples, outputs, failures, kinds=dict(kinds), served=served,
                        targets=list(data.target_batches(batch_size)))


def verify_repository(
    repository: Path | S3Url,
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
    workdir: Path = Path("build"),
    tensorrt: TensorRT | None = None,
    collect: Collect | None = None,
    accuracy_target: float | None = None,
) -> dict:
    """Verify the pipeline's ONNX variants in ``repository`` through Triton at ``url`` (None: the
    embedded server on ``repository``), every output by the kind its build recorded; write
    ``report_path``; raise CheckFailed when a served check fails.

    Each model's data: ``eval_data[base model]`` (an EvalData or an .npz), else what its build
    recorded, else ``<calibration-root>/<base>/eval.npz``. ``gates`` gives the drop limits and the
    confidence; the other limits are the ones its build was judged with. What cannot be verified here
    (TensorRT plans, models the pipeline did not build, models without data) is listed as not verified.

    With the embedded server, a TensorRT plan built for another TensorRT version or GPU than the
    ones at hand (``tensorrt``, default: the installed TensorRT) is refused in one line.

    ``collect`` fetches the served outputs (default: :func:`served_outputs`); ``accuracy_target`` (0.99: MLPerf's
    99 % rule) also holds each variant's task metric to that share of served FP32's.
    """
    from pipeline.triton.s3repository import readable

    with readable(repository) as local:  # an s3:// repository: a copy of what its server serves, read here
        planned, limits, not_verified = _verification_plan(local, embedded=url is None, models=models, calibration_root=calibration_root,
                                                           batch_size=batch_size, gates=gates, eval_data=eval_data or {}, tensorrt=tensorrt)
        results = _served_results(planned, limits, url=url, repository=repository, workdir=workdir, atol=atol, collect=collect or served_outputs)
    return _verdict(results, limits, not_verified, url=url, repository=repository, report_path=report_path, show=show,
                    accuracy_target=accuracy_target)


def _verification_plan(repository: Path, *, embedded: bool, models: Sequence[str], calibration_root: Path, batch_size: int, gates: Gates,
                       eval_data: Mapping[str, EvalData | Path], tensorrt: TensorRT | None) -> tuple[dict[str, tuple], dict[str, Gates], dict[str, str]]:
    """What :func:`verify_repository` sends through the server (see :func:`_planned`), the limits, and what it cannot verify;
    every refusal that comes before a server starts."""
    chosen, not_verified, plans = _servable_models(repository, models)
    if plans and embedded:  # a plan the GPU at hand cannot load is refused even where nothing else is verifiable
        _check_plans_at_hand(plans, tensorrt or PolygraphyTensorRT())
    missing = sorted(set(models) - set(chosen) - set(not_verified))
    if missing or not chosen:
        raise PipelineError(f"no servable pipeline ONNX model named {missing or 'any'} in {repository}", "run `python -m pipeline build` or check --model")
    planned, limits = _planned(chosen, not_verified, eval_data, calibration_root, batch_size, gates)
    return planned, limits, not_verified


def _served_results(planned: Mapping[str, tuple], limits: Mapping[str, Gates], *, url: str | None, repository: Path | S3Url, workdir: Path,
                    atol: float, collect: Collect) -> list[ServedResult]:
    """Every planned model sent through Triton at ``url`` (None: the embedded server on ``repository``)."""
    from pipeline.triton.server import TritonServer

    server = None if url else TritonServer(repository, workdir=workdir)
    results = []
    with server if server else contextlib.nullcontext(), progress("served verification", len(planned), unit="models") as bar:
        endpoint = url or server.http_url  # type: ignore[union-attr]
        for name, (version, model_file, data, kinds, batch) in bar.track(planned.items()):
            bar.note(name)
            log.info("verifying %s v%d through %s (%d samples from %s)", name, version, endpoint, data.num_samples, data.source)
            served = collect(endpoint, name, data, list(kinds), batch)
            results.append(served_against_file(name, model_file, data, kinds, served, batch_size=batch, atol=_served_atol(name, atol, limits[name]),
                                               threshold=limits[name].binary_threshold))
            results[-1].fp32_on_same_values = _fp32_on_same_values(endpoint, name, model_file, data, list(kinds), batch, planned, collect)
    return results


def _fp32_on_same_values(endpoint: str, name: str, model_file: Path, data: EvalData, outputs: list[str], batch: int,
                         planned: Mapping[str, tuple], collect: Collect) -> list[dict[str, np.ndarray]] | None:
    """For a uint8-input variant: served FP32's outputs on the values it computed on (its uint8 samples × scale), so
    that it is judged for its graph, as its build's parity gate judged it, not for samples off the uint8 grid; None
    for other models, or without a served FP32 sibling."""
    from pipeline.data.uint8_wire import dequantized, uint8_scales

    base, _ = parse_variant(name) or (name, "")
    scales = uint8_scales(model_file)
    if not scales or f"{base}_fp32" not in planned:
        return None
    return collect(endpoint, f"{base}_fp32", data.with_inputs(lambda feed: dequantized(feed, scales), "as floats"), outputs, batch)


def _verdict(results: list[ServedResult], limits: Mapping[str, Gates], not_verified: Mapping[str, str], *, url: str | None, repository: Path | S3Url,
             report_path: Path, show: Callable[[list[dict]], None] | None, accuracy_target: float | None = None) -> dict:
    """Each served variant judged against served FP32 (and held to ``accuracy_target`` of its task metric), the report
    written (and shown), CheckFailed on any failure."""
    gate_against_fp32(results, limits)
    if accuracy_target is not None:
        against_share_of_fp32(results, accuracy_target)
    rows = results_as_json(results)
    report = {"url": url or "embedded", "repository": str(repository), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "models": rows,
              "not_verified": dict(not_verified), "accuracy_target": accuracy_target}
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    if show:
        show(rows + [{"model": n, "not_verified": why} for n, why in sorted(not_verified.items())])
    failed = [r for r in results if r.failures]
    if failed:
        raise CheckFailed(
            "served accuracy check failed: " + "; ".join(f"{r.model}: {', '.join(r.failures)}" for r in failed) + f" (report: {report_path})",
            _fix_for(failed),
        )
    return report


def _fix_for(failed: Sequence[ServedResult]) -> str:
    """What to look at, given the served checks that failed."""
    hints = []
    if any(r.precision == "int8" for r in failed):
        hints.append("for INT8, make sure the server keeps Q/DQ exact (optimization graph level 2 in config.pbtxt)")
    # Served and in-process use the same file and samples, so a scale only shows against FP32.
    if any(r.precision == "u8" and any(f.startswith(AGAINST_FP32) for f in r.failures) for r in failed):
        hints.append("for a uint8-input variant, check the scale recorded in its model file against how its inputs are scaled (--uint8-input)")
    if any(f.startswith(MLPERF_TARGET) for r in failed for f in r.failures):
        hints.append("a variant below MLPerf's accuracy target: rebuild it with a lower --int8-max-drop or --fp16-max-drop (the "
                     "build's fallback then keeps more of it in float), or hold it to the other target (99% or 99.9%)")
    return "; ".join(hints) or "compare the served outputs with the report's rows; the server log says what runtime served each model"


def _check_plans_at_hand(plans: Mapping[str, Path], tensorrt: TensorRT) -> None:
    """Refuse, in one line, a plan the TensorRT and GPU at hand cannot load (nothing to check without them)."""
    from pipeline.backend.plan_binding import check_plan_models

    platform = tensorrt.platform()
    if platform is None:
        return
    where = f"this machine (TensorRT {platform.tensorrt_version}, {platform.gpu.name})"
    check_plan_models(plans, tensorrt_version=platform.tensorrt_version, compute_capability=platform.gpu.compute_capability, target=where)


def _servable_models(repository: Path, models: Sequence[str]) -> tuple[dict[str, Any], dict[str, str], dict[str, Path]]:
    """The pipeline's ONNX models of ``repository`` (those named in ``models``, or all), why the others cannot be
    verified here, and the TensorRT plan models among them (name → model folder)."""
    from pipeline.triton.repository import read_repository

    chosen, not_verified, plans = {}, {}, {}
    for name, model in sorted(read_repository(repository).items()):
        if models and name not in models:
            continue
        if model.config.platform == "tensorrt_plan" or model.config.backend == "tensorrt":
            plans[name] = model.path
        if model.config.platform != "onnxruntime_onnx":
            needs = " (a TensorRT plan needs a GPU server)" if name in plans else ""
            not_verified[name] = f"{model.config.platform or model.config.backend} models need their own runtime{needs}"
        elif parse_variant(name) is None:
            not_verified[name] = "not built by this pipeline (no variant suffix): no build record to judge it by"
        else:
            chosen[name] = model
    return chosen, not_verified, plans


def _planned(chosen: Mapping[str, Any], not_verified: dict[str, str], eval_data: Mapping[str, EvalData | Path], calibration_root: Path,
             batch_size: int, gates: Gates) -> tuple[dict[str, tuple], dict[str, Gates]]:
    """Per model: (version, model file, data, kinds, batch) and the limits its build recorded; a model
    without data joins ``not_verified``. The variants of one base model share the smallest batch."""
    planned: dict[str, tuple] = {}
    limits: dict[str, Gates] = {}
    batches: dict[str, int] = {}
    for name, model in chosen.items():
        base, _ = parse_variant(name)  # type: ignore[misc]
        batches[base] = min(batches.get(base, batch_size), model.config.max_batch_size or batch_size)
    for name, model in chosen.items():
        base, _ = parse_variant(name)  # type: ignore[misc]
        plan = _plan(name, model, base, eval_data.get(base), calibration_root)
        if isinstance(plan, str):
            not_verified[name] = plan
            continue
        planned[name] = (*plan, batches[base])
        limits[name] = _recorded_gates(model.path, gates)
    for name, why in not_verified.items():
        log.warning("%s: not verified: %s", name, why)
    if not planned:
        raise PipelineError(f"no evaluation data for any of {sorted(chosen)}", "pass --eval-data PATH.npz (one array per input name, plus labels)")
    return planned, limits


def _plan(name: str, model: Any, base: str, given: EvalData | Path | None, calibration_root: Path) -> tuple | str:
    """(version, model file, data with labels named, kinds) of one served model, or why it cannot be verified."""
    from pipeline.accuracy.evaldata import check_targets, eval_data_from_path, plain_labels_owner
    from pipeline.accuracy.outputkinds import decide_kinds, kinds_from_json, onnx_producers, output_info
    from pipeline.data.tensors import load_onnx, signature_from_onnx
    from pipeline.data.uint8_wire import SCALE_KEY, float_inputs, quantized, uint8_scales
    from pipeline.data.workspace import build_record_of_served, eval_data_of_served

    version = max(model.versions)
    model_file = model.path / str(version) / (model.config.default_model_filename or "model.onnx")
    signature = signature_from_onnx(model_file)
    scales = uint8_scales(model_file)  # a --uint8-input variant: its inputs are the float samples as a client sends them
    if parse_variant(name)[1] in WIRE_PRECISIONS and not scales:  # type: ignore[index]
        return f"its model file records no uint8 input scale ({SCALE_KEY}), so float samples cannot be sent as uint8: rebuild it with --uint8-input"
    source = given if given is not None else eval_data_of_served(model.path, calibration_root)
    if source is None:
        return f"no evaluation data (none recorded by its build, no {calibration_root / base / 'eval.npz'}): pass --eval-data"
    data = source if isinstance(source, EvalData) else eval_data_from_path(Path(source), float_inputs(signature, scales, Path(source)))
    if scales:
        data = data.with_inputs(lambda feed: quantized(feed, scales), "as uint8")
    recorded = build_record_of_served(model.path).get("output_kinds")
    if recorded:
        kinds = kinds_from_json(recorded)
    else:
        kinds = decide_kinds(signature, described=None, producers=onnx_producers(load_onnx(model_file, external_data=False)), overrides={})
        log.warning("%s: no output kinds recorded by its build; judged as %s", name, ", ".join(f"{k.name}={k.kind}" for k in kinds.values()))
    owner = plain_labels_owner(data.target_names, output_info(signature, kinds), data.source)
    if owner:
        data = data.with_targets_named(owner)
    for bucket in data.buckets:
        check_targets(bucket.targets, output_info(signature, kinds), data.source)
    return version, model_file, data, kinds


def _served_atol(model: str, atol: float, gates: Gates) -> float:
    """FP16 served on other hardware (a GPU's FP16 kernels against this CPU's) differs at FP16's own
    precision: it is held to ``--fp16-atol`` where that is looser than ``atol``."""
    variant = parse_variant(model)
    return max(atol, gates.fp16_atol or 0.0) if variant is not None and variant[1] == "fp16" else atol


def _recorded_gates(model_dir: Path, gates: Gates) -> Gates:
    """The limits the model's build was judged with, with this command's drop limits and confidence."""
    from dataclasses import fields, replace

    from pipeline.data.workspace import build_record_of_served

    recorded = build_record_of_served(model_dir).get("gates") or {}
    known = {f.name for f in fields(Gates)}
    base = replace(Gates(), **{k: v for k, v in recorded.items() if k in known})
    return replace(base, fp16_max_drop=gates.fp16_max_drop, int8_max_drop=gates.int8_max_drop, gate_confidence=gates.gate_confidence)
