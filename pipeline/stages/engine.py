"""TensorRT engines (plans) from ONNX models: strongly typed builds with optimization profiles.

Precision comes from the ONNX graph (FP16 tensors, explicit INT8 Q/DQ), never from builder
flags: the network is strongly typed and no ``BuilderFlag.FP16``/``INT8`` is set (TensorRT 11
removed both, and strongly typed is its only mode). Beside each plan goes ``<plan>.json``: the
TensorRT version, GPU and compute capability, hardware-compatibility level, TF32 and host-code
settings, I/O tensors, profiles read back from the engine, device memory and build time.

Every call into TensorRT goes through the :class:`~pipeline.backend.trt_seam.TensorRT` seam the
caller passes in (the product's :class:`~pipeline.backend.trt_seam.PolygraphyTensorRT`); this module
only checks the request, writes the files atomically and records the metadata. So it imports and
runs its own logic without TensorRT.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.backend.tensorrt_env import GpuInfo
from pipeline.backend.trt_seam import HARDWARE_LEVELS, MAX_OPTIMIZATION_LEVEL, EngineRequest, IOTensor, TensorRT
from pipeline.core.atomic import write_bytes_atomic
from pipeline.core.errors import PipelineError
from pipeline.core.fingerprint import hash_path
from pipeline.data.artifacts import PRECISIONS, Artifact
from pipeline.data.profiles import ShapeProfile, profiles_to_json

log = logging.getLogger(__name__)

__all__ = ["EngineSettings", "IOTensor", "engine_from_onnx", "engine_request", "engine_metadata", "metadata_path", "read_engine_metadata",
           "write_engine_metadata"]

METADATA_FORMAT = 1


# TensorRT DataType names -> numpy dtype names, for the types numpy has.
_NUMPY_DTYPES = {
    "FLOAT": "float32", "HALF": "float16", "INT8": "int8", "UINT8": "uint8",
    "INT32": "int32", "INT64": "int64", "BOOL": "bool",
}


@dataclass(frozen=True)
class EngineSettings:
    """How one plan is built: the engine stage's one setting (the stage cache hashes its fields)."""

    precision: str  # labels the artifact; the ONNX graph decides the math
    profiles: tuple[ShapeProfile, ...]  # every dynamic input in every profile (profiles_from_args)
    optimization_level: int = 3
    workspace_mib: int | None = None
    tf32: bool = True  # TensorRT's own default; recorded, and the FP32 engine's gate follows it
    hardware_compatible: bool = False  # Ampere+ plans that load on any GPU of compute capability >= 8.0
    allow_host_code: bool = False  # whether plans may be deserialized with their embedded host code

    @property
    def hardware_compatibility(self) -> str:
        """TensorRT's HardwareCompatibilityLevel name."""
        return "AMPERE_PLUS" if self.hardware_compatible else "NONE"


# --- building ---------------------------------------------------------------------------------


def metadata_path(plan_path: Path) -> Path:
    """Where a plan's metadata JSON goes: ``<plan>.json`` (``digits_int8.plan.json``)."""
    plan_path = Path(plan_path)
    return plan_path.with_name(plan_path.name + ".json")


def _check_settings(onnx_path: Path, settings: EngineSettings) -> None:
    if not onnx_path.is_file():
        raise PipelineError(f"ONNX model {onnx_path} does not exist", "run the ONNX export step first (python -m pipeline build)")
    if settings.precision not in PRECISIONS:
        raise PipelineError(f"unknown precision '{settings.precision}'", f"use one of: {', '.join(PRECISIONS)}")
    if not 0 <= settings.optimization_level <= MAX_OPTIMIZATION_LEVEL:
        raise PipelineError(
            f"TensorRT builder optimization level must be 0..{MAX_OPTIMIZATION_LEVEL}, got {settings.optimization_level}",
            "use 3 (TensorRT's default) or higher for faster engines that take longer to build",
        )
    if settings.workspace_mib is not None and settings.workspace_mib < 1:
        raise PipelineError(f"workspace limit must be at least 1 MiB, got {settings.workspace_mib}", "omit it to let TensorRT decide")
    assert settings.hardware_compatibility in HARDWARE_LEVELS


def engine_request(onnx_path: Path, settings: EngineSettings, *, timing_cache: bytes | None) -> EngineRequest:
    """What the seam is asked to build for ``settings`` (checked first), with ``timing_cache`` (None: start empty)."""
    _check_settings(onnx_path, settings)
    return EngineRequest(
        onnx_path=onnx_path,
        precision=settings.precision,
        profiles=tuple(ShapeProfile(dict(p.shapes)) for p in settings.profiles),
        optimization_level=settings.optimization_level,
        workspace_mib=settings.workspace_mib,
        tf32=settings.tf32,
        hardware_compatibility=settings.hardware_compatibility,
        timing_cache=timing_cache,
    )


def engine_from_onnx(
    onnx_path: Path,
    plan_path: Path,
    *,
    settings: EngineSettings,
    timing_cache: Path,
    tensorrt: TensorRT,
) -> Artifact:
    """Build a strongly typed TensorRT plan from ``onnx_path`` through ``tensorrt`` and write it with its metadata JSON.

    ``settings.profiles`` must cover every dynamic input (see :func:`pipeline.stages.shapes.profiles_from_args`).
    The timing cache at ``timing_cache`` is loaded if present and written back after the build.
    Needs TensorRT and an NVIDIA GPU: raises PipelineError (check ``tensorrt.status()`` first to skip cleanly).
    """
    onnx_path, plan_path, timing_cache = Path(onnx_path), Path(plan_path), Path(timing_cache)
    request = engine_request(onnx_path, settings, timing_cache=timing_cache.read_bytes() if timing_cache.is_file() else None)
    log.info("building %s TensorRT engine from %s", settings.precision, onnx_path)
    start = time.perf_counter()
    built = tensorrt.build(request)
    build_seconds = time.perf_counter() - start
    write_bytes_atomic(plan_path, memoryview(built.plan))  # a killed build must not leave a truncated plan under the real name
    write_bytes_atomic(timing_cache, memoryview(built.timing_cache))
    facts = built.facts
    metadata = engine_metadata(
        precision=settings.precision,
        plan_path=plan_path,
        onnx_path=onnx_path,
        tensorrt_version=facts.tensorrt_version,
        gpu=facts.gpu,
        io=facts.io,
        profiles=facts.profiles,
        device_memory_bytes=facts.device_memory_bytes,
        build_seconds=build_seconds,
        settings={"optimization_level": settings.optimization_level, "workspace_mib": settings.workspace_mib,
                  "timing_cache": str(timing_cache), "timing_cache_loaded": facts.timing_cache_loaded, "layers": facts.layers,
                  "workspace_bytes": facts.workspace_bytes},
        hardware_compatibility=facts.hardware_compatibility,
        tf32=settings.tf32,
        allow_host_code=settings.allow_host_code,
        strongly_typed=facts.strongly_typed,
    )
    meta_path = metadata_path(plan_path)
    write_engine_metadata(meta_path, metadata)
    log.info("wrote %s (%.1f s, %d bytes) on %s", plan_path, build_seconds, metadata["plan_bytes"], facts.gpu.name)
    return Artifact(settings.precision, "plan", plan_path, metadata=meta_path)


# --- metadata ---------------------------------------------------------------------------------


def engine_metadata(
    *,
    precision: str,
    plan_path: Path,
    onnx_path: Path,
    tensorrt_version: str,
    gpu: GpuInfo,
    io: Sequence[IOTensor],
    profiles: Sequence[ShapeProfile],
    device_memory_bytes: int,
    build_seconds: float,
    settings: Mapping[str, Any],
    hardware_compatibility: str = "NONE",
    tf32: bool = True,
    allow_host_code: bool = False,
    strongly_typed: bool = True,
) -> dict[str, Any]:
    """The metadata JSON for one plan, from plain values (the files must exist: they are hashed).

    What the plan is bound to is recorded so ``verify`` and publishing can refuse it elsewhere: the
    TensorRT version, the GPU's compute capability and the hardware-compatibility level (``NONE``:
    this compute capability only; ``AMPERE_PLUS``: any GPU of compute capability 8.0 or newer)."""

    def tensor(t: IOTensor) -> dict[str, Any]:
        return {"name": t.name, "dtype": _NUMPY_DTYPES.get(t.dtype, t.dtype.lower()), "trt_dtype": t.dtype, "shape": list(t.shape)}

    return {
        "format": METADATA_FORMAT,
        "precision": precision,
        "plan": Path(plan_path).name,
        "plan_bytes": Path(plan_path).stat().st_size,
        "plan_sha256": hash_path(Path(plan_path)),
        "onnx": str(onnx_path),
        "onnx_sha256": hash_path(Path(onnx_path)),
        "tensorrt_version": tensorrt_version,
        "strongly_typed": bool(strongly_typed),
        "gpu": {
            "index": gpu.index,
            "name": gpu.name,
            "compute_capability": ".".join(map(str, gpu.compute_capability)),
        },
        "hardware_compatibility": hardware_compatibility,
        "tf32": bool(tf32),
        "host_code_allowed": bool(allow_host_code),
        "inputs": [tensor(t) for t in io if t.mode == "input"],
        "outputs": [tensor(t) for t in io if t.mode == "output"],
        "profiles": profiles_to_json(profiles),
        "device_memory_bytes": int(device_memory_bytes),
        "build_seconds": round(float(build_seconds), 3),
        "build_settings": dict(settings),
    }


def write_engine_metadata(path: Path, metadata: Mapping[str, Any]) -> None:
    """Write ``metadata`` as indented JSON (atomically)."""
    write_bytes_atomic(Path(path), (json.dumps(metadata, indent=2, sort_keys=True) + "\n").encode())


def read_engine_metadata(path: Path) -> dict[str, Any]:
    """Read a plan's metadata JSON; PipelineError if missing or of another format."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"engine metadata {path} does not exist", "rebuild the engine (python -m pipeline build)")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise PipelineError(f"engine metadata {path} is not valid JSON ({exc})", "rebuild the engine (python -m pipeline build)") from None
    if not isinstance(data, dict) or data.get("format") != METADATA_FORMAT:
        raise PipelineError(f"engine metadata {path} is not in format {METADATA_FORMAT}", "rebuild the engine")
    return data


