"""Which models of a Triton repository the CPU-only embedded tritonserver can serve, and why not the others."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError, require

log = logging.getLogger(__name__)

# How Triton maps a platform to a backend name when the config names no backend.
PLATFORM_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "pytorch_libtorch": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
}


def read_model_config(model_dir: Path, config_name: str | None = None) -> Any | None:
    """The model's ``ModelConfig`` protobuf (``configs/<config_name>.pbtxt`` first, as Triton does), or None."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    path = model_dir / "config.pbtxt"
    if config_name and (model_dir / "configs" / f"{config_name}.pbtxt").is_file():
        path = model_dir / "configs" / f"{config_name}.pbtxt"
    if not path.is_file():
        return None
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except text_format.ParseError as exc:
        raise PipelineError(f"{path} is not a valid Triton model config: {exc}", "fix or regenerate the repository") from None
    return config


def skip_reason(config: Any | None, backends: set[str], skipped: dict[str, str]) -> str | None:
    """Why a model cannot be served with ``backends``, or None if it can (``skipped``: models skipped so far)."""
    if config is None:
        return "no config.pbtxt"
    if config.platform == "ensemble":
        blocked = sorted({step.model_name for step in config.ensemble_scheduling.step} & set(skipped))
        return f"ensemble uses skipped models {blocked}" if blocked else None
    backend = config.backend or PLATFORM_BACKENDS.get(config.platform, "")
    if backend == "tensorrt":
        return "TensorRT plan: needs the TensorRT backend and an NVIDIA GPU (this embedded server is CPU-only)"
    if backend not in backends:
        return f"backend '{backend or config.platform}' is not in the embedded server (it has: {', '.join(sorted(backends))})"
    return None


def servable_models(
    repository: Path, backends: set[str], config_name: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """Split the repository's models into those ``backends`` can serve and ``{skipped: reason}``."""
    require(repository.is_dir(), f"the model repository {repository} does not exist",
            "build it first: python -m pipeline build (or pass --repository)")
    dirs = sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
    require(bool(dirs), f"the model repository {repository} has no models",
            "build it first: python -m pipeline build (or pass --repository)")
    configs = {d.name: read_model_config(d, config_name) for d in dirs}
    # Ensembles last, so they see which of their steps were skipped.
    order = sorted(configs, key=lambda name: getattr(configs[name], "platform", "") == "ensemble")
    skipped: dict[str, str] = {}
    for name in order:
        reason = skip_reason(configs[name], backends, skipped)
        if reason:
            skipped[name] = reason
            log.info("skipping model '%s': %s", name, reason)
    served = [name for name in configs if name not in skipped]
    require(
        bool(served),
        f"none of the models in {repository} can be served by the CPU-only embedded tritonserver "
        f"(skipped: {'; '.join(f'{n}: {r}' for n, r in skipped.items())})",
        "build ONNX variants too; the onnxruntime backend serves them here",
    )
    return served, skipped
