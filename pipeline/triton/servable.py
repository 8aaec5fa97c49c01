"""Which models of a Triton repository the CPU-only embedded tritonserver can serve, and why not the others."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.errors import require
from pipeline.triton.config import read_model_config
from pipeline.triton.repository import model_dirs

log = logging.getLogger(__name__)

# How Triton maps a platform to a backend name when the config names no backend.
PLATFORM_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "pytorch_libtorch": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
}


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
    configs = {d.name: read_model_config(d, config_name) for d in model_dirs(repository)}
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
