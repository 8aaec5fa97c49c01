"""TensorRT engines (plans) from ONNX models: strongly typed builds with optimization profiles.

Precision comes from the ONNX graph (FP16 tensors, explicit INT8 Q/DQ), never from builder
flags: the network is strongly typed and no ``BuilderFlag.FP16``/``INT8`` is set (TensorRT 11
removed both, and strongly typed is its only mode). Beside each plan goes ``<plan>.json``: the
TensorRT version, GPU, I/O tensors, profiles read back from the engine, device memory and build
time. Everything TensorRT is imported inside functions, so this module imports without it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.artifacts import PRECISIONS, Artifact
from pipeline.errors import PipelineError
from pipeline.fingerprint import hash_path
from pipeline.stages.tensorrt_env import GpuInfo, cuda_gpu, require_tensorrt, tensorrt_version_tuple
from pipeline.stages.shapes import Shape, ShapeProfile, format_shape_spec, profiles_to_json

if TYPE_CHECKING:
    import tensorrt as trt
    from polygraphy.backend.base import BaseRunner

log = logging.getLogger(__name__)
trt_log = logging.getLogger(__name__ + ".tensorrt")

MAX_OPTIMIZATION_LEVEL = 5
METADATA_FORMAT = 1


# TensorRT DataType names -> numpy dtype names, for the types numpy has.
_NUMPY_DTYPES = {
    "FLOAT": "float32", "HALF": "float16", "INT8": "int8", "UINT8": "uint8",
    "INT32": "int32", "INT64": "int64", "BOOL": "bool",
}


@dataclass(frozen=True)
class IOTensor:
    """One engine input or output: ``mode`` is "input" or "output", ``dtype`` the TensorRT type name."""

    name: str
    mode: str
    dtype: str
    shape: Shape  # -1 for dynamic axes


# --- building ---------------------------------------------------------------------------------


def metadata_path(plan_path: Path) -> Path:
    """Where a plan's metadata JSON goes: ``<plan>.json`` (``digits_int8.plan.json``)."""
    plan_path = Path(plan_path)
    return plan_path.with_name(plan_path.name + ".json")


def _check_build_args(
    onnx_path: Path, precision: str, optimization_level: int, workspace_mib: int | None
) -> None:
    if not onnx_path.is_file():
        raise PipelineError(f"ONNX model {onnx_path} does not exist", "run the ONNX export step first (python -m pipeline build)")
    if precision not in PRECISIONS:
        raise PipelineError(f"unknown precision '{precision}'", f"use one of: {', '.join(PRECISIONS)}")
    if not 0 <= optimization_level <= MAX_OPTIMIZATION_LEVEL:
        raise PipelineError(
            f"TensorRT builder optimization level must be 0..{MAX_OPTIMIZATION_LEVEL}, got {optimization_level}",
            "use 3 (TensorRT's default) or higher for faster engines that take longer to build",
        )
    if workspace_mib is not None and workspace_mib < 1:
        raise PipelineError(f"workspace limit must be at least 1 MiB, got {workspace_mib}", "omit it to let TensorRT decide")


def _make_logger() -> trt.ILogger:
    """A TensorRT logger that forwards to Python logging (TensorRT's own Logger prints)."""
    import tensorrt as trt

    severity = trt.ILogger.Severity
    levels = {
        severity.INTERNAL_ERROR: logging.CRITICAL,
        severity.ERROR: logging.ERROR,
        severity.WARNING: logging.WARNING,
        severity.INFO: logging.INFO,
        severity.VERBOSE: logging.DEBUG,
    }

    class ToLogging(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
            trt_log.log(levels.get(severity, logging.INFO), "%s", msg)

    return ToLogging()


def _network_flags() -> int:
    import tensorrt as trt

    if tensorrt_version_tuple(trt.__version__)[0] >= 11:
        return 0  # TensorRT 11: strongly typed is the only mode and the flag is deprecated
    # TensorRT 10: EXPLICIT_BATCH is deprecated and ignored (always explicit), so only this flag.
    return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def _parse_onnx(onnx_path: Path, network: trt.INetworkDefinition, logger: trt.ILogger) -> trt.OnnxParser:
    import tensorrt as trt

    parser = trt.OnnxParser(network, logger)
    # parse_from_file (not parse(bytes)) so external-data weights next to the model are found.
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)] or ["no error reported"]
        raise PipelineError(
            f"TensorRT's ONNX parser rejected {onnx_path}: " + " | ".join(e.replace("\n", " ") for e in errors),
            "check the model with `polygraphy inspect model` and the ONNX opset TensorRT supports",
        )
    return parser


def _dims(values: Sequence[int]) -> trt.Dims:
    import tensorrt as trt

    return trt.Dims(list(values))


def _shape(dims: trt.Dims) -> Shape:
    return tuple(int(dims[i]) for i in range(len(dims)))


def _add_profiles(
    builder: trt.Builder, network: trt.INetworkDefinition, config: trt.IBuilderConfig, profiles: Sequence[ShapeProfile]
) -> None:
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    dynamic = [t.name for t in inputs if any(d < 0 for d in _shape(t.shape))]
    known = {t.name for t in inputs}
    used = [p for p in profiles if p.shapes]
    if dynamic and not used:
        raise PipelineError(
            f"inputs {', '.join(dynamic)} have dynamic axes but no optimization profile was given",
            "pass profiles from pipeline.stages.shapes.profiles_from_args (--shape INPUT:MIN/OPT/MAX)",
        )
    for index, profile in enumerate(used):
        missing = [name for name in dynamic if name not in profile.shapes]
        unknown = [name for name in profile.shapes if name not in known]
        if missing or unknown:
            raise PipelineError(
                f"optimization profile {index} does not match the TensorRT network "
                f"(missing dynamic inputs: {missing or 'none'}; unknown inputs: {unknown or 'none'})",
                "derive profiles from this ONNX model's signature with profiles_from_args",
            )
        trt_profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile.shapes.items():
            try:
                trt_profile.set_shape(name, _dims(lo), _dims(opt), _dims(hi))
            except RuntimeError as exc:
                raise PipelineError(
                    f"TensorRT rejected the shape range {format_shape_spec(name, (lo, opt, hi))}: {exc}",
                    "fix that --shape so MIN <= OPT <= MAX and fixed axes match the model",
                ) from None
        if config.add_optimization_profile(trt_profile) < 0:
            raise PipelineError(f"TensorRT rejected optimization profile {index} ({profile})", "check the --shape ranges")


def _attach_timing_cache(config: trt.IBuilderConfig, path: Path) -> None:
    """Load the persisted timing cache (or start an empty one) so repeated builds skip tactic timing."""
    if path.is_file():
        cache = config.create_timing_cache(path.read_bytes())
        if cache is not None and config.set_timing_cache(cache, ignore_mismatch=False):
            log.info("using timing cache %s", path)
            return
        # Made by another TensorRT version or GPU (or truncated): its timings do not apply here.
        log.warning("timing cache %s does not match this TensorRT/GPU; starting a fresh one", path)
    config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)


def _write_atomic(path: Path, data: Any) -> None:
    """Write bytes (or any buffer) so a crash never leaves a half-written file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def engine_from_onnx(
    onnx_path: Path,
    plan_path: Path,
    *,
    precision: str,
    profiles: Sequence[ShapeProfile],
    timing_cache: Path,
    optimization_level: int = 3,
    workspace_mib: int | None = None,
) -> Artifact:
    """Build a strongly typed TensorRT plan from ``onnx_path`` and write it with its metadata JSON.

    ``precision`` labels the artifact; the ONNX graph decides the math. ``profiles`` must cover
    every dynamic input (see :func:`pipeline.stages.shapes.profiles_from_args`). The timing cache
    at ``timing_cache`` is loaded if present and written back after the build. Needs TensorRT and
    an NVIDIA GPU: raises PipelineError (check :func:`pipeline.stages.tensorrt_env.tensorrt_status` first to skip cleanly).
    """
    onnx_path, plan_path, timing_cache = Path(onnx_path), Path(plan_path), Path(timing_cache)
    _check_build_args(onnx_path, precision, optimization_level, workspace_mib)
    require_tensorrt()
    gpu = cuda_gpu()
    import tensorrt as trt

    log.info("building %s TensorRT engine from %s on %s", precision, onnx_path, gpu.name)
    start = time.perf_counter()
    logger = _make_logger()  # must outlive builder, runtime and engine
    try:
        builder = trt.Builder(logger)
    except (TypeError, RuntimeError) as exc:  # the binding reports a failed CUDA init this way
        raise PipelineError(
            f"TensorRT could not create a builder on {gpu.name} ({exc})",
            "check that the NVIDIA driver supports the CUDA version of the TensorRT wheel (nvidia-smi)",
        ) from None
    network = builder.create_network(_network_flags())
    parser = _parse_onnx(onnx_path, network, logger)
    config = builder.create_builder_config()
    config.builder_optimization_level = optimization_level
    if workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    _add_profiles(builder, network, config, profiles)
    _attach_timing_cache(config, timing_cache)

    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise PipelineError(
            f"TensorRT could not build an engine from {onnx_path} (its errors are logged above)",
            "try a lower --optimization-level or a larger workspace, or check the ONNX graph with polygraphy",
        )
    build_seconds = time.perf_counter() - start
    _write_atomic(plan_path, memoryview(plan))
    _write_atomic(timing_cache, memoryview(config.get_timing_cache().serialize()))
    del parser, network  # the parser owns the weights the network pointed to; the plan has its own copy

    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    if engine is None:
        raise PipelineError(f"TensorRT could not load the plan it just built ({plan_path})", "see the TensorRT errors logged above")
    metadata = engine_metadata(
        precision=precision,
        plan_path=plan_path,
        onnx_path=onnx_path,
        tensorrt_version=trt.__version__,
        gpu=gpu,
        io=_engine_io(engine),
        profiles=_engine_profiles(engine),
        device_memory_bytes=_device_memory(engine),
        build_seconds=build_seconds,
        settings={"optimization_level": optimization_level, "workspace_mib": workspace_mib, "timing_cache": str(timing_cache)},
    )
    meta_path = metadata_path(plan_path)
    write_engine_metadata(meta_path, metadata)
    log.info("wrote %s (%.1f s, %d bytes)", plan_path, build_seconds, metadata["plan_bytes"])
    return Artifact(precision, "plan", plan_path, metadata=meta_path)


# --- metadata ---------------------------------------------------------------------------------


def _engine_io(engine: trt.ICudaEngine) -> list[IOTensor]:
    import tensorrt as trt

    io = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        mode = "input" if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else "output"
        io.append(IOTensor(name, mode, engine.get_tensor_dtype(name).name, _shape(engine.get_tensor_shape(name))))
    return io


def _engine_profiles(engine: trt.ICudaEngine) -> list[ShapeProfile]:
    """The (min, opt, max) shapes the engine really holds, per profile and dynamic input."""
    import tensorrt as trt

    inputs = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in inputs if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    dynamic = [n for n in inputs if any(d < 0 for d in _shape(engine.get_tensor_shape(n)))]
    profiles = []
    for index in range(engine.num_optimization_profiles):
        shapes = {}
        for name in dynamic:
            lo, opt, hi = (_shape(d) for d in engine.get_tensor_profile_shape(name, index))
            shapes[name] = (lo, opt, hi)
        profiles.append(ShapeProfile(shapes))
    return profiles


def _device_memory(engine: trt.ICudaEngine) -> int:
    # device_memory_size_v2 (10.x) includes weight-streaming scratch; TensorRT 11 dropped the v1 property.
    if hasattr(engine, "device_memory_size_v2"):
        return int(engine.device_memory_size_v2)
    return int(engine.device_memory_size)


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
) -> dict[str, Any]:
    """The metadata JSON for one plan, from plain values (the files must exist: they are hashed)."""

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
        "strongly_typed": True,
        "gpu": {
            "index": gpu.index,
            "name": gpu.name,
            "compute_capability": ".".join(map(str, gpu.compute_capability)),
        },
        "inputs": [tensor(t) for t in io if t.mode == "input"],
        "outputs": [tensor(t) for t in io if t.mode == "output"],
        "profiles": profiles_to_json(profiles),
        "device_memory_bytes": int(device_memory_bytes),
        "build_seconds": round(float(build_seconds), 3),
        "build_settings": dict(settings),
    }


def write_engine_metadata(path: Path, metadata: Mapping[str, Any]) -> None:
    """Write ``metadata`` as indented JSON (atomically)."""
    _write_atomic(Path(path), (json.dumps(metadata, indent=2, sort_keys=True) + "\n").encode())


def read_engine_metadata(path: Path) -> dict[str, Any]:
    """Read a plan's metadata JSON; PipelineError if missing or of another format."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"engine metadata {path} does not exist", "rebuild the engine (python -m pipeline build)")
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != METADATA_FORMAT:
        raise PipelineError(f"engine metadata {path} is not in format {METADATA_FORMAT}", "rebuild the engine")
    return data


# --- running ----------------------------------------------------------------------------------


def runner_for_engine(plan_path: Path, *, name: str | None = None) -> BaseRunner:
    """A Polygraphy TrtRunner over the plan at ``plan_path`` (deserialized when the runner activates)."""
    plan_path = Path(plan_path)
    if not plan_path.is_file():
        raise PipelineError(f"TensorRT plan {plan_path} does not exist", "build it first (python -m pipeline build)")
    require_tensorrt()
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    runner: BaseRunner = TrtRunner(EngineFromBytes(BytesFromPath(str(plan_path))), name=name)
    return runner
