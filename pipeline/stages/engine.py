"""TensorRT engines (plans) from ONNX models: strongly typed builds with optimization profiles.

Precision comes from the ONNX graph (FP16 tensors, explicit INT8 Q/DQ), never from builder
flags: the network is strongly typed and no ``BuilderFlag.FP16``/``INT8`` is set (TensorRT 11
removed both, and strongly typed is its only mode). Beside each plan goes ``<plan>.json``: the
TensorRT version, GPU, I/O tensors, profiles read back from the engine, device memory and build
time. Everything TensorRT is imported inside functions, so this module imports without it.

The build uses Polygraphy's TensorRT loaders: ``NetworkFromOnnxPath`` (strongly typed network,
``parse_from_file`` so external weights are found), ``CreateConfig`` (optimization profiles,
builder optimization level, workspace limit — never its ``fp16=``/``int8=`` flags) and
``EngineFromNetwork``. Two steps stay by hand, for documented reasons:

* the timing cache: Polygraphy's ``load_timing_cache`` ignores the result of ``set_timing_cache``, so
  a cache written by another TensorRT version or GPU would silently not apply, and its
  ``save_timing_cache`` merges that foreign cache in (``ignore_mismatch=True``) and writes the file in
  place. Here a mismatched cache is replaced by a fresh one with a warning (``PostprocessConfig``),
  and the cache is written atomically;
* ``SaveEngine`` writes the plan in place: a killed build could leave a truncated plan under the
  real name, so the plan is serialized and written with :func:`pipeline.atomic.write_bytes_atomic`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.artifacts import PRECISIONS, Artifact
from pipeline.atomic import write_bytes_atomic
from pipeline.errors import PipelineError
from pipeline.fingerprint import hash_path
from pipeline.stages.tensorrt_env import GpuInfo, cuda_gpu, require_tensorrt, tensorrt_version_tuple
from pipeline.stages.shapes import Shape, ShapeProfile, format_shape_spec, profiles_to_json

if TYPE_CHECKING:
    import tensorrt as trt
    from polygraphy.backend.base import BaseRunner

log = logging.getLogger(__name__)

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


def _strongly_typed() -> bool:
    """Whether the network needs the STRONGLY_TYPED creation flag (TensorRT 10; in 11 it is the only mode)."""
    import tensorrt as trt

    return tensorrt_version_tuple(trt.__version__)[0] < 11


def _shape(dims: trt.Dims) -> Shape:
    return tuple(int(dims[i]) for i in range(len(dims)))


def _check_profiles(network: trt.INetworkDefinition, profiles: Sequence[ShapeProfile]) -> list[ShapeProfile]:
    """The profiles to build with, checked against the parsed network (Polygraphy would fill missing
    inputs with guessed shapes and pass bad ranges on to TensorRT)."""
    inputs = {t.name: _shape(t.shape) for t in (network.get_input(i) for i in range(network.num_inputs))}
    dynamic = [name for name, shape in inputs.items() if any(d < 0 for d in shape)]
    used = [p for p in profiles if p.shapes]
    if dynamic and not used:
        raise PipelineError(
            f"inputs {', '.join(dynamic)} have dynamic axes but no optimization profile was given",
            "pass profiles from pipeline.stages.shapes.profiles_from_args (--shape INPUT:MIN/OPT/MAX)",
        )
    for index, profile in enumerate(used):
        missing = [name for name in dynamic if name not in profile.shapes]
        unknown = [name for name in profile.shapes if name not in inputs]
        if missing or unknown:
            raise PipelineError(
                f"optimization profile {index} does not match the TensorRT network "
                f"(missing dynamic inputs: {missing or 'none'}; unknown inputs: {unknown or 'none'})",
                "derive profiles from this ONNX model's signature with profiles_from_args",
            )
        for name, (lo, opt, hi) in profile.shapes.items():
            model = inputs[name]
            fits = len(lo) == len(opt) == len(hi) == len(model) and all(
                a <= b <= c and (d < 0 or a == c == d) for a, b, c, d in zip(lo, opt, hi, model)
            )
            if not fits:
                raise PipelineError(
                    f"TensorRT cannot use the shape range {format_shape_spec(name, (lo, opt, hi))} for input "
                    f"'{name}' of shape {list(model)}",
                    "fix that --shape so MIN <= OPT <= MAX and fixed axes match the model",
                )
    return used


def _polygraphy_profiles(profiles: Sequence[ShapeProfile]) -> list[Any]:
    from polygraphy.backend.trt import Profile

    out = []
    for profile in profiles:
        trt_profile = Profile()
        for name, (lo, opt, hi) in profile.shapes.items():
            trt_profile.add(name, min=lo, opt=opt, max=hi)
        out.append(trt_profile)
    return out


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

    from polygraphy.backend.trt import CreateConfig, EngineFromNetwork, NetworkFromOnnxPath, PostprocessConfig
    from polygraphy.exception import PolygraphyException

    log.info("building %s TensorRT engine from %s on %s", precision, onnx_path, gpu.name)
    start = time.perf_counter()
    try:
        builder, network, parser = NetworkFromOnnxPath(str(onnx_path), strongly_typed=_strongly_typed())()
    except (PolygraphyException, TypeError, RuntimeError) as exc:  # a failed CUDA init surfaces as TypeError/RuntimeError
        raise PipelineError(
            f"TensorRT could not parse {onnx_path} on {gpu.name}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}",
            "check the model with `polygraphy inspect model`, the ONNX opset TensorRT supports, and that the "
            "NVIDIA driver supports the CUDA version of the TensorRT wheel (nvidia-smi)",
        ) from None
    used = _check_profiles(network, profiles)
    pools = {trt.MemoryPoolType.WORKSPACE: workspace_mib << 20} if workspace_mib is not None else None
    create = CreateConfig(profiles=_polygraphy_profiles(used) or None, builder_optimization_level=optimization_level,
                          memory_pool_limits=pools)
    config = PostprocessConfig(create, lambda _builder, _network, cfg: _attach_timing_cache(cfg, timing_cache))(builder, network)
    try:
        engine = EngineFromNetwork((builder, network, parser), config=config)()
    except PolygraphyException:
        raise PipelineError(
            f"TensorRT could not build an engine from {onnx_path} (its errors are logged above)",
            "try a lower --optimization-level or a larger workspace, or check the ONNX graph with polygraphy",
        ) from None
    build_seconds = time.perf_counter() - start
    write_bytes_atomic(plan_path, memoryview(engine.serialize()))
    write_bytes_atomic(timing_cache, memoryview(config.get_timing_cache().serialize()))
    del parser, network  # the parser owns the weights the network pointed to; the engine has its own copy

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
