"""The build orchestrator: its body is the data flow from a Keras model to a Triton repository.

Each ``_stage`` helper below binds one stage (a path in, a path out) to the stage cache, so a
stage runs only when the hash of its inputs and settings changed, and records it in the manifest.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from pipeline.artifacts import Artifact
from pipeline.config import BuildConfig, Workspace
from pipeline.errors import PipelineError
from pipeline.evaldata import EvalData, eval_data_from_npz, synthetic_eval_data
from pipeline.publish import LABELS_FILE, PublishSettings, repository_from_artifacts
from pipeline.stagecache import Manifest, run_stage
from pipeline.stages.accuracy import accuracy_report_from_variants, classifier_output
from pipeline.stages.calibration import calibration_from_path, shape_bounds
from pipeline.stages.engine import engine_from_onnx, metadata_path
from pipeline.stages.fp16 import DEFAULT_FP32_OPS, fp16_onnx_from_onnx
from pipeline.stages.int8 import check_qdq_int8_symmetric, qdq_onnx_from_onnx
from pipeline.stages.onnx_export import onnx_from_savedmodel, tf2onnx_command
from pipeline.stages.parity import parity_report_from_models
from pipeline.stages.savedmodel import savedmodel_from_keras
from pipeline.stages.shapes import ShapeProfile, profiles_from_args, profiles_to_json
from pipeline.stages.source import (
    DEFAULT_MODEL,
    ModelSource,
    keras_model_from_source,
    model_source,
)
from pipeline.stages.tensorrt_env import tensorrt_status
from pipeline.tensors import ModelSignature, signature_from_onnx
from pipeline.triton.verify import verify_repository

log = logging.getLogger(__name__)

TOOLS = ("tensorflow-cpu", "tensorflow", "keras", "tf2onnx", "onnx", "onnxruntime", "onnxconverter-common", "polygraphy", "tritonclient", "nvidia-pytriton", "numpy", "tensorrt")
EVAL_BATCH = 64


@dataclass
class BuildResult:
    """What a build produced: the workspace, the artifacts, and the manifest path."""

    name: str
    workspace: Workspace
    artifacts: list[Artifact]
    manifest: Path
    repository: Path | None


def build(cfg: BuildConfig) -> BuildResult:
    """Keras model → SavedModel → ONNX (parity-checked against TF) → … (see README)."""
    cfg.validate()
    source = model_source(cfg.model)
    name = cfg.model_name(source)
    ws = Workspace(cfg.workdir / name)
    ws.root.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(ws.manifest, cfg.command, tool_versions())

    if source.spec == DEFAULT_MODEL:
        ensure_default_data(cfg.calibration_root / name)
    try:
        saved = _savedmodel_stage(source, ws, cfg, manifest)
        onnx_fp32 = _onnx_stage(saved, ws, cfg, manifest)
        signature = signature_from_onnx(onnx_fp32)
        data = eval_data_for(cfg, name, signature)
        _parity_stage(saved, onnx_fp32, data, ws, cfg, manifest)
        profiles = profiles_from_args(cfg.shapes, signature, max_batch=cfg.max_batch)
        variants = [Artifact("fp32", "onnx", onnx_fp32)]
        variants += [_precision_stage(onnx_fp32, p, signature, profiles, name, ws, cfg, manifest) for p in cfg.precisions[1:]]
        engines = _engine_stages(variants, profiles, ws, cfg, manifest)
        _accuracy_stage(onnx_fp32, variants[1:] + engines, data, signature, ws, cfg, manifest)
        artifacts = variants + engines
        manifest.artifacts = {f"{a.precision}.{a.kind}": str(a.path) for a in artifacts}
        repository = _publish_stage(artifacts, variants, data, signature, name, ws, cfg, manifest)
        if cfg.verify_served or cfg.verify_url:
            _served_stage(artifacts, name, ws, cfg, manifest)
    finally:
        manifest.write()  # also for a failed build: which stage failed, and why
    return BuildResult(name, ws, artifacts, ws.manifest, repository)


def _savedmodel_stage(source: ModelSource, ws: Workspace, cfg: BuildConfig, manifest: Manifest) -> Path:
    if source.kind == "savedmodel":
        manifest.not_run("savedmodel", f"input is already a SavedModel: {source.path}")
        return Path(source.path)  # type: ignore[arg-type]
    run_stage(
        manifest, "savedmodel",
        inputs={"model": source.fingerprint()},
        settings={"model": source.spec},
        outputs=[ws.savedmodel],
        produce=lambda: savedmodel_from_keras(keras_model_from_source(source), ws.savedmodel),
        reproduce=cfg.command,
    )
    return ws.savedmodel


def _onnx_stage(saved: Path, ws: Workspace, cfg: BuildConfig, manifest: Manifest) -> Path:
    dst = ws.onnx("fp32")
    run_stage(
        manifest, "onnx",
        inputs={"savedmodel": saved},
        settings={"opset": cfg.opset},
        outputs=[dst],
        produce=lambda: onnx_from_savedmodel(saved, dst, cfg.opset),
        reproduce=" ".join(tf2onnx_command(saved, dst, cfg.opset)),
    )
    return dst


def _parity_stage(saved: Path, onnx_path: Path, data: EvalData, ws: Workspace, cfg: BuildConfig, manifest: Manifest) -> None:
    gates = cfg.gates
    run_stage(
        manifest, "parity",
        inputs={"savedmodel": saved, "onnx": onnx_path, "data": data.fingerprint},
        settings={"atol": gates.parity_atol, "rtol": gates.parity_rtol},
        outputs=[ws.parity],
        produce=lambda: parity_report_from_models(saved, onnx_path, data, ws.parity, atol=gates.parity_atol, rtol=gates.parity_rtol, batch_size=EVAL_BATCH),
        reproduce=cfg.command,
    )


def _precision_stage(
    onnx_fp32: Path, precision: str, signature: ModelSignature, profiles: list[ShapeProfile], name: str, ws: Workspace, cfg: BuildConfig, manifest: Manifest
) -> Artifact:
    dst = ws.onnx(precision)
    if precision == "fp16":
        run_stage(
            manifest, "fp16",
            inputs={"onnx": onnx_fp32},
            settings={"keep_fp32_ops": list(DEFAULT_FP32_OPS)},
            outputs=[dst],
            produce=lambda: fp16_onnx_from_onnx(onnx_fp32, dst),
            reproduce=cfg.command,
        )
        return Artifact("fp16", "onnx", dst)
    calib_path = cfg.calibration or cfg.calibration_root / name
    hints = {n: r[1][1:] for n, r in profiles[0].shapes.items()} if profiles else {}  # image size for dynamic H×W
    bounds = shape_bounds(p.shapes for p in profiles)  # array samples of any size inside the profiles
    calib = calibration_from_path(calib_path, signature, preprocess=cfg.preprocess, shape_hint=hints, shape_bounds=bounds)
    run_stage(
        manifest, "int8",
        inputs={"onnx": onnx_fp32, "calibration": calib.fingerprint()},
        settings={"method": cfg.calibration_method},
        outputs=[dst],
        produce=lambda: qdq_onnx_from_onnx(onnx_fp32, dst, calib, method=cfg.calibration_method),
        reproduce=cfg.command,
    )
    check_qdq_int8_symmetric(dst)  # also on a cache hit: what is published must be symmetric int8
    return Artifact("int8", "onnx", dst)


def _engine_stages(variants: list[Artifact], profiles: list[ShapeProfile], ws: Workspace, cfg: BuildConfig, manifest: Manifest) -> list[Artifact]:
    if not cfg.engine:
        manifest.not_run("engine", "disabled with --no-engine")
        return []
    available, reason = tensorrt_status()
    if not available:
        log.warning("%s", reason)
        manifest.not_run("engine", reason)
        return []
    log.info("%s", reason)
    engines = []
    for variant in variants:
        plan = ws.plan(variant.precision)
        plan.parent.mkdir(parents=True, exist_ok=True)
        run_stage(
            manifest, f"engine-{variant.precision}",
            inputs={"onnx": variant.path},
            settings={"profiles": profiles_to_json(profiles), "optimization_level": cfg.optimization_level, "device": reason},
            outputs=[plan, metadata_path(plan)],
            produce=lambda v=variant, p=plan: engine_from_onnx(
                v.path, p, precision=v.precision, profiles=profiles, timing_cache=ws.timing_cache, optimization_level=cfg.optimization_level
            ),
            reproduce=cfg.command,
        )
        engines.append(Artifact(variant.precision, "plan", plan, metadata=metadata_path(plan)))
    return engines


def _accuracy_stage(
    onnx_fp32: Path, candidates: list[Artifact], data: EvalData, signature: ModelSignature, ws: Workspace, cfg: BuildConfig, manifest: Manifest
) -> None:
    if not candidates:
        manifest.not_run("accuracy", "no variant besides FP32 ONNX (add --fp16 or --int8)")
        return
    run_stage(
        manifest, "accuracy",
        inputs={"fp32": onnx_fp32, **{f"{a.precision}-{a.kind}": a.path for a in candidates}, "data": data.fingerprint},
        settings={"gates": asdict(cfg.gates)},
        outputs=[ws.accuracy],
        produce=lambda: accuracy_report_from_variants(
            onnx_fp32, candidates, data, ws.accuracy, gates=cfg.gates, signature=signature, batch_size=EVAL_BATCH
        ),
        reproduce=cfg.command,
    )
    manifest.results["accuracy"] = json.loads(ws.accuracy.read_text())


def _publish_stage(
    artifacts: list[Artifact], variants: list[Artifact], data: EvalData, signature: ModelSignature, name: str, ws: Workspace, cfg: BuildConfig, manifest: Manifest
) -> Path:
    labels = cfg.calibration_root / name / LABELS_FILE
    settings = PublishSettings(
        model=name,
        repository=cfg.repository,
        max_batch=cfg.max_batch,
        version_policy=cfg.version_policy,
        reproduce=cfg.command,
        labels=labels if labels.exists() else None,
        classifier_output=classifier_output(signature),
        mig=cfg.mig,
        image=cfg.triton_image,
    )
    published = [cfg.repository / a.triton_name(name) / "config.pbtxt" for a in artifacts]
    report = {"manifest": str(ws.manifest), "accuracy": manifest.results.get("accuracy"), "versions": manifest.versions}
    run_stage(
        manifest, "publish",
        inputs={**{a.triton_name(name): a.path for a in artifacts}, "data": data.fingerprint, **({"labels": labels} if settings.labels else {})},
        settings={k: str(v) for k, v in asdict(settings).items() if k != "reproduce"},  # the command is recorded, not keyed
        outputs=[ws.published, *published],
        produce=lambda: ws.published.write_text(
            json.dumps([str(p) for p in repository_from_artifacts(artifacts, {v.precision: v.path for v in variants}, data.head(1), settings, report)]) + "\n"
        ),
        reproduce=cfg.command,
    )
    return cfg.repository


def _served_stage(artifacts: list[Artifact], name: str, ws: Workspace, cfg: BuildConfig, manifest: Manifest) -> None:
    started = time.perf_counter()
    report = verify_repository(
        cfg.repository,
        url=cfg.verify_url,
        models=[a.triton_name(name) for a in artifacts if a.kind == "onnx"],
        calibration_root=cfg.calibration_root,
        batch_size=EVAL_BATCH,
        atol=1e-3,
        max_drop={"fp16": cfg.gates.fp16_max_drop, "int8": cfg.gates.int8_max_drop},
        report_path=ws.served,
    )
    manifest.results["served"] = report
    manifest.ran("served", time.perf_counter() - started, f"through {cfg.verify_url or 'the embedded tritonserver'}")


def ensure_default_data(folder: Path) -> None:
    """The bundled model's eval/calibration data, regenerated (deterministically, offline) where missing,
    e.g. when building outside the source tree."""
    from pipeline.models import digits

    if not all((folder / f).is_file() for f in ("eval.npz", "calib.npz", "labels.txt")):
        log.info("writing the bundled model's evaluation and calibration data to %s", folder)
        digits.write_data(folder)


def eval_data_for(cfg: BuildConfig, name: str, signature: ModelSignature) -> EvalData:
    """``--eval-data``, else ``<calibration>/<name>/eval.npz``, else seeded synthetic samples."""
    path = cfg.eval_data or cfg.calibration_root / name / "eval.npz"
    if path.exists():
        return eval_data_from_npz(path, signature)
    if cfg.eval_data is not None:
        raise PipelineError(f"evaluation data '{path}' does not exist", "pass an .npz with one array per input (and labels) to --eval-data")
    log.warning("no evaluation data at %s: parity runs on synthetic samples and accuracy gates have no labels", path)
    return synthetic_eval_data(signature, samples=128)


def tool_versions() -> dict[str, str]:
    """Versions of Python and of the installed tools the build uses."""
    versions = {"python": platform.python_version()}
    for dist in TOOLS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions
