"""The build orchestrator: its body is the data flow from a Keras model to a Triton repository.

Each ``_stage`` helper below binds one stage (a path in, a path out) to the stage cache, so a
stage runs only when the hash of its inputs and settings changed, and records it in the manifest.
"""

from __future__ import annotations

import logging
import platform
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pipeline.artifacts import Artifact
from pipeline.config import BuildConfig, Workspace
from pipeline.errors import PipelineError
from pipeline.evaldata import EvalData, eval_data_from_npz, synthetic_eval_data
from pipeline.stagecache import Manifest, run_stage
from pipeline.stages.onnx_export import onnx_from_savedmodel, tf2onnx_command
from pipeline.stages.parity import parity_report_from_models
from pipeline.stages.savedmodel import savedmodel_from_keras
from pipeline.stages.source import ModelSource, keras_model_from_source, model_source
from pipeline.tensors import ModelSignature, signature_from_onnx

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

    saved = _savedmodel_stage(source, ws, cfg, manifest)
    onnx_fp32 = _onnx_stage(saved, ws, cfg, manifest)
    signature = signature_from_onnx(onnx_fp32)
    data = eval_data_for(cfg, name, signature)
    _parity_stage(saved, onnx_fp32, data, ws, cfg, manifest)
    artifacts = [Artifact("fp32", "onnx", onnx_fp32)]

    manifest.artifacts = {f"{a.precision}.{a.kind}": str(a.path) for a in artifacts}
    manifest.write()
    return BuildResult(name, ws, artifacts, ws.manifest, None)


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
