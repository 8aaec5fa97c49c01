"""Which models of a Triton repository the embedded tritonserver can serve, why not the others,
and the private *view* of the repository it is started on.

The view holds one symlink per servable model, so the on-disk repository stays untouched. On a
machine without a GPU, a model whose config asks for ``KIND_GPU`` instances (a per-MIG-profile config,
``--model-config-name 1g.5gb``) would fail to load; in the view it gets a rewritten copy of that one
config file with ``KIND_CPU`` instances (same counts), everything else still symlinked — a CPU
rehearsal of the GPU config, said in one log line.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from pipeline.core.errors import require
from pipeline.triton.config import config_text, model_config_path, read_model_config
from pipeline.triton.repository import model_dirs

log = logging.getLogger(__name__)

GPU_SERVE_EXTRA = "gpu-serve"  # pyproject.toml: onnxruntime-gpu for GPU instances

# How Triton maps a platform to a backend name when the config names no backend.
PLATFORM_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "pytorch_libtorch": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
}


# The Python backend's key for letting GPU tensors reach execute() (default "yes": every input copied to the host).
GPU_INPUTS_PARAMETER = "FORCE_CPU_ONLY_INPUT_TENSORS"

def skip_reason(config: Any | None, backends: set[str], skipped: dict[str, str]) -> str | None:
    """Why a model cannot be served with ``backends``, or None if it can (``skipped``: models skipped so far)."""
    if config is None:
        return "no config.pbtxt"
    if config.platform == "ensemble":
        blocked = sorted({step.model_name for step in config.ensemble_scheduling.step} & set(skipped))
        return f"ensemble uses skipped models {blocked}" if blocked else None
    backend = config.backend or PLATFORM_BACKENDS.get(config.platform, "")
    if backend == "tensorrt":
        return "TensorRT plan: needs the TensorRT backend and an NVIDIA GPU (the embedded server has only the Python backend)"
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
        f"none of the models in {repository} can be served by the embedded tritonserver (Python backends only) "
        f"(skipped: {'; '.join(f'{n}: {r}' for n, r in skipped.items())})",
        "build ONNX variants too; the onnxruntime backend serves them here",
    )
    return served, skipped


def cpu_int8_files(repository: Path, models: list[str]) -> dict[str, Path]:
    """The model file Triton serves of each CPU INT8 variant (``*_int8cpu``) among ``models``: its latest version (the
    version policy the pipeline publishes), by "name/version"."""
    from pipeline.data.artifacts import parse_variant

    files = {}
    for name in models:
        variant = parse_variant(name)
        if variant is None or variant[1] != "int8cpu":
            continue
        versions = sorted((p for p in (Path(repository) / name).iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
        if versions and (versions[-1] / "model.onnx").is_file():
            files[f"{name}/{versions[-1].name}"] = versions[-1] / "model.onnx"
    return files


def require_cpu_int8_runs_here(repository: Any, local: Path, models: list[str]) -> None:
    """PipelineError (one line) when a CPU INT8 model's weights need VNNI and this x86 CPU has none
    (:mod:`pipeline.backend.cpu_kernels`): served here it would not compute what its gate judged. ``local`` is
    ``repository`` itself, or a bucket's configs copied (then the CPU INT8 models' files are fetched)."""
    import contextlib

    from pipeline.backend.cpu_kernels import check_runs_here
    from pipeline.triton.s3repository import readable

    bucket = local != repository and any(name.endswith("_int8cpu") for name in models)
    with readable(repository) if bucket else contextlib.nullcontext(local) as files:
        check_runs_here(cpu_int8_files(files, models))


def has_gpu() -> bool:
    """Whether tritonserver started from this process will see an NVIDIA GPU: the kernel driver lists
    one (``/proc/driver/nvidia/gpus/*``) and ``CUDA_VISIBLE_DEVICES`` does not hide them all."""
    gpus = Path("/proc/driver/nvidia/gpus")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return False
    return gpus.is_dir() and any(gpus.iterdir())


def gpu_instance_models(repository: Path, models: list[str], config_name: str | None = None) -> list[str]:
    """The ONNX models among ``models`` that Triton gives GPU instances on a machine with a GPU
    (instance groups of ``KIND_GPU`` or ``KIND_AUTO``, or none: Triton's default is AUTO)."""
    chosen = []
    for name in models:
        config = read_model_config(Path(repository) / name, config_name)
        if config is None or (config.backend or PLATFORM_BACKENDS.get(config.platform, "")) != "onnxruntime":
            continue
        if not config.instance_group or any(g.kind in (g.KIND_GPU, g.KIND_AUTO) for g in config.instance_group):
            chosen.append(name)
    return chosen


def require_gpu_runtime(models: list[str], providers: list[str]) -> None:
    """PipelineError unless ONNX Runtime (``providers``: its available providers) can run GPU instances of ``models``."""
    require(
        not models or "CUDAExecutionProvider" in providers,
        f"this machine has an NVIDIA GPU, so tritonserver gives {', '.join(models)} GPU instances, but this venv's "
        f"ONNX Runtime is the CPU build (providers: {', '.join(providers)})",
        f"install the '{GPU_SERVE_EXTRA}' extra, onnxruntime-gpu in place of onnxruntime (bash scripts/setup.sh --gpu "
        "does it), or hide the GPU (CUDA_VISIBLE_DEVICES=) to serve on the CPU",
    )


def write_view(repository: Path, models: list[str], view: Path, config_name: str | None = None, *, cpu_only: bool) -> list[str]:
    """Fill ``view`` with ``models`` of ``repository``; return the models whose KIND_GPU instance
    groups were switched to KIND_CPU (only when ``cpu_only``). On a GPU host, the view's configs of
    models our Python ``onnxruntime`` backend serves get ``FORCE_CPU_ONLY_INPUT_TENSORS: no``, so the
    Python backend hands GPU inputs (a client's CUDA shared memory) to the backend as GPU tensors
    instead of copying them to the host first (python_backend README, "Input Tensor Device
    Placement"); the repository's own configs are untouched (NGC Triton's C++ backend needs no such key)."""
    switched = []
    for name in models:
        source = (Path(repository) / name).resolve()
        config = read_model_config(source, config_name)
        gpu_groups = [g for g in config.instance_group if g.kind == g.KIND_GPU] if config is not None else []
        switch = cpu_only and bool(gpu_groups)
        device_inputs = (not cpu_only and config is not None and config.platform == "onnxruntime_onnx"
                         and GPU_INPUTS_PARAMETER not in config.parameters)
        if not (switch or device_inputs):
            (view / name).symlink_to(source, target_is_directory=True)
            continue
        assert config is not None
        for group in gpu_groups if switch else ():
            group.kind = group.KIND_CPU
            del group.gpus[:]
        if device_inputs:
            config.parameters[GPU_INPUTS_PARAMETER].string_value = "no"
        used = model_config_path(source, config_name).relative_to(source)
        target = view / name
        target.mkdir()
        for entry in source.iterdir():
            if entry.name != used.parts[0]:
                (target / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
        (target / used).parent.mkdir(parents=True, exist_ok=True)  # configs/ holds only the config in use
        (target / used).write_text(config_text(config))
        if switch:
            switched.append(name)
    if switched:
        which = f"configs/{config_name}.pbtxt where present" if config_name else "config.pbtxt"
        log.info("no GPU here: serving the KIND_GPU instances of %s (%s) as KIND_CPU, same counts",
                 ", ".join(switched), which)
    return switched
