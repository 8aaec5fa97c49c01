"""The one seam between the pipeline and TensorRT: every call into ``tensorrt`` and into Polygraphy's
TensorRT backend is in this module, behind the :class:`TensorRT` interface.

* :meth:`TensorRT.build`: parse an ONNX model into a strongly typed network, build a plan with the
  given optimization profiles and settings, and read back what the engine holds
  (:class:`BuiltEngine`: plan bytes, timing cache, :class:`EngineFacts`);
* :meth:`TensorRT.runner`: a Polygraphy runner over a plan, with ``set_profile(index)``;
* :meth:`TensorRT.describe`: Polygraphy's text summary of a plan (``inspect``);
* :meth:`TensorRT.status` / :meth:`TensorRT.platform`: can engines be built here, and for what (the
  real one asks :mod:`pipeline.stages.tensorrt_env`, the availability probe: the module's version,
  the driver's CUDA version and the GPU, through ctypes).

The product uses :class:`PolygraphyTensorRT` (the default of ``BuildConfig.tensorrt``, not a
command-line option). A caller that cannot have TensorRT (the CI tests) passes another
implementation of the same interface through the config; nothing is patched.

Why some steps are done by hand rather than by Polygraphy's loaders:

* the timing cache: Polygraphy's ``load_timing_cache`` ignores the result of ``set_timing_cache``, so
  a cache written by another TensorRT version or GPU would silently not apply, and its
  ``save_timing_cache`` merges that foreign cache in (``ignore_mismatch=True``). Here a mismatched
  cache is replaced by a fresh one with a warning (``PostprocessConfig``);
* deserializing: Polygraphy's ``EngineFromBytes`` sets ``IRuntime.engine_host_code_allowed = True``
  for every plan (loader.py, "to deserialize version compatible engines"), so a plan from elsewhere
  could run its embedded host code. Here host code is allowed only when asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.errors import PipelineError
from pipeline.stages.shapes import Shape, ShapeProfile, format_shape_spec
from pipeline.stages.tensorrt_env import GpuInfo, cuda_gpu, require_tensorrt, tensorrt_status, tensorrt_version_tuple

if TYPE_CHECKING:
    import tensorrt as trt
    from polygraphy.backend.base import BaseRunner

log = logging.getLogger(__name__)

MAX_OPTIMIZATION_LEVEL = 5
# TensorRT's HardwareCompatibilityLevel names this pipeline builds with ("NONE": this GPU's architecture only).
HARDWARE_LEVELS = ("NONE", "AMPERE_PLUS")


@dataclass(frozen=True)
class IOTensor:
    """One engine input or output: ``mode`` is "input" or "output", ``dtype`` the TensorRT type name."""

    name: str
    mode: str
    dtype: str
    shape: Shape  # -1 for dynamic axes


@dataclass(frozen=True)
class EngineRequest:
    """What to build: a strongly typed plan of ``onnx_path`` (precision lives in the graph)."""

    onnx_path: Path
    precision: str  # what the graph holds (fp32, fp16, int8 Q/DQ): for messages, no builder flag follows from it
    profiles: tuple[ShapeProfile, ...]  # every dynamic input in every profile; () for a static model
    optimization_level: int  # 0..MAX_OPTIMIZATION_LEVEL
    workspace_mib: int | None  # None: TensorRT's default (the GPU's memory)
    tf32: bool  # let FP32 layers use TF32 tensor cores (TensorRT's default: on)
    hardware_compatibility: str  # one of HARDWARE_LEVELS
    timing_cache: bytes | None  # a previous build's cache; None: start empty


@dataclass(frozen=True)
class EngineFacts:
    """What a built engine holds and where it was built, read back from TensorRT."""

    tensorrt_version: str
    gpu: GpuInfo
    io: tuple[IOTensor, ...]
    profiles: tuple[ShapeProfile, ...]  # (min, opt, max) of each dynamic input, per profile
    device_memory_bytes: int
    hardware_compatibility: str  # one of HARDWARE_LEVELS, as the engine reports it


@dataclass(frozen=True)
class BuiltEngine:
    """A serialized plan, the timing cache to keep for the next build, and the engine's facts."""

    plan: bytes
    timing_cache: bytes
    facts: EngineFacts


@dataclass(frozen=True)
class Platform:
    """The TensorRT and GPU at hand."""

    tensorrt_version: str
    gpu: GpuInfo


class TensorRT(Protocol):
    """Everything the pipeline asks of TensorRT (see the module docstring)."""

    def status(self) -> tuple[bool, str]:
        """Whether engines can be built here, and one line saying why (not)."""

    def platform(self) -> Platform | None:
        """The TensorRT version and GPU at hand; None where there is none."""

    def build(self, request: EngineRequest) -> BuiltEngine:
        """Build a plan; PipelineError when TensorRT cannot parse the model or build the engine."""

    def runner(self, plan_path: Path, *, allow_host_code: bool, name: str | None = None) -> BaseRunner:
        """A Polygraphy runner over the plan, with ``set_profile(index)`` once active."""

    def describe(self, plan_path: Path, *, allow_host_code: bool) -> str:
        """Polygraphy's text summary of a plan (I/O tensors, profiles)."""


# --- the real one ------------------------------------------------------------------------------


def _shape(dims: trt.Dims) -> Shape:
    return tuple(int(dims[i]) for i in range(len(dims)))


def check_profiles(inputs: dict[str, Shape], profiles: Sequence[ShapeProfile]) -> list[ShapeProfile]:
    """The profiles to build with, checked against the network's inputs (name → shape, -1 dynamic):
    Polygraphy would fill missing inputs with guessed shapes and pass bad ranges on to TensorRT."""
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


def _attach_timing_cache(config: trt.IBuilderConfig, data: bytes | None) -> None:
    """Load the previous build's timing cache (or start an empty one) so repeated builds skip tactic timing."""
    if data:
        cache = config.create_timing_cache(data)
        if cache is not None and config.set_timing_cache(cache, ignore_mismatch=False):
            log.info("using the timing cache of an earlier build")
            return
        # Made by another TensorRT version or GPU (or truncated): its timings do not apply here.
        log.warning("the timing cache does not match this TensorRT/GPU; starting a fresh one")
    config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)


def _major(version: str) -> int:
    return tensorrt_version_tuple(version)[0]


class PolygraphyTensorRT:
    """The product's :class:`TensorRT`: the ``tensorrt`` module through Polygraphy's loaders."""

    def status(self) -> tuple[bool, str]:
        """See :func:`pipeline.stages.tensorrt_env.tensorrt_status`."""
        return tensorrt_status()

    def platform(self) -> Platform | None:
        """The installed TensorRT and GPU 0, or None if either is missing."""
        if not self.status()[0]:
            return None
        import tensorrt as trt

        return Platform(str(trt.__version__), cuda_gpu())

    def build(self, request: EngineRequest) -> BuiltEngine:
        """Strongly typed network (Polygraphy ``NetworkFromOnnxPath``, ``parse_from_file`` so external
        weights are found), ``CreateConfig`` with the profiles, optimization level, workspace, TF32 and
        hardware compatibility (never its ``fp16=``/``int8=`` flags), ``EngineFromNetwork``."""
        require_tensorrt()
        gpu = cuda_gpu()
        import tensorrt as trt

        from polygraphy.backend.trt import CreateConfig, EngineFromNetwork, NetworkFromOnnxPath, PostprocessConfig
        from polygraphy.exception import PolygraphyException

        onnx_path = request.onnx_path
        if request.hardware_compatibility == "AMPERE_PLUS" and gpu.compute_capability < (8, 0):
            # TensorRT API, HardwareCompatibilityLevel.kAMPERE_PLUS: "only supported for engines built on NVIDIA Ampere and later GPUs".
            raise PipelineError(f"--hardware-compatible plans must be built on an Ampere or newer GPU; {gpu.name} has compute capability "
                                f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}",
                                "build on a GPU of compute capability 8.0 or newer, or leave out --hardware-compatible")
        log.info("building a %s TensorRT %s engine from %s on %s", request.precision, trt.__version__, onnx_path, gpu.name)
        # TensorRT 10 needs the STRONGLY_TYPED creation flag; in 11 strongly typed is the only mode.
        strongly_typed = _major(trt.__version__) < 11
        try:
            builder, network, parser = NetworkFromOnnxPath(str(onnx_path), strongly_typed=strongly_typed)()
        except (PolygraphyException, TypeError, RuntimeError) as exc:  # a failed CUDA init surfaces as TypeError/RuntimeError
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else str(exc)
            raise PipelineError(
                f"TensorRT could not parse {onnx_path} on {gpu.name}: {last}",
                "check the model with `polygraphy inspect model`, the ONNX opset TensorRT supports, and that the "
                "NVIDIA driver supports the CUDA version of the TensorRT wheel (nvidia-smi)",
            ) from None
        inputs = {t.name: _shape(t.shape) for t in (network.get_input(i) for i in range(network.num_inputs))}
        used = check_profiles(inputs, request.profiles)
        pools = {trt.MemoryPoolType.WORKSPACE: request.workspace_mib << 20} if request.workspace_mib is not None else None
        level = getattr(trt.HardwareCompatibilityLevel, request.hardware_compatibility)
        create = CreateConfig(profiles=_polygraphy_profiles(used) or None, builder_optimization_level=request.optimization_level,
                              memory_pool_limits=pools, tf32=request.tf32,
                              hardware_compatibility_level=None if request.hardware_compatibility == "NONE" else level)
        config = PostprocessConfig(create, lambda _b, _n, cfg: _attach_timing_cache(cfg, request.timing_cache))(builder, network)
        try:
            engine = EngineFromNetwork((builder, network, parser), config=config)()
        except PolygraphyException:
            raise PipelineError(
                f"TensorRT could not build the {request.precision} engine from {onnx_path} (its errors are logged above)",
                "try a lower --optimization-level or a larger workspace, or check the ONNX graph with polygraphy",
            ) from None
        plan = bytes(engine.serialize())
        cache = bytes(config.get_timing_cache().serialize())
        del parser, network  # the parser owns the weights the network pointed to; the engine has its own copy
        facts = EngineFacts(
            tensorrt_version=str(trt.__version__),
            gpu=gpu,
            io=tuple(_engine_io(engine)),
            profiles=tuple(_engine_profiles(engine)),
            device_memory_bytes=_device_memory(engine),
            hardware_compatibility=str(engine.hardware_compatibility_level.name),
        )
        return BuiltEngine(plan, cache, facts)

    def runner(self, plan_path: Path, *, allow_host_code: bool, name: str | None = None) -> BaseRunner:
        """Polygraphy's TrtRunner over the plan, deserialized when the runner activates (host code
        only with ``allow_host_code``)."""
        require_tensorrt()
        from polygraphy.backend.trt import TrtRunner

        runner: BaseRunner = TrtRunner(lambda: _deserialize(Path(plan_path), allow_host_code), name=name)
        return runner

    def describe(self, plan_path: Path, *, allow_host_code: bool) -> str:
        """Polygraphy's ``str_from_engine`` (it takes an execution context since 0.50)."""
        require_tensorrt()
        from polygraphy.backend.trt.util import str_from_engine

        engine = _deserialize(Path(plan_path), allow_host_code)
        context = engine.create_execution_context()
        return str(str_from_engine(engine, context, show_layers=False))


def _deserialize(plan_path: Path, allow_host_code: bool) -> trt.ICudaEngine:
    import tensorrt as trt

    from polygraphy.backend.trt.util import get_trt_logger

    logger = get_trt_logger()
    # TensorRT's standard plugins (what the ONNX parser falls back to for some ops) must be registered before a plan
    # that uses one deserializes; the build registered them while parsing, a fresh process (inspect, verify) has not.
    # Polygraphy's EngineFromBytes does the same (backend/trt/loader.py, 0.53.6).
    trt.init_libnvinfer_plugins(logger, "")
    runtime = trt.Runtime(logger)
    # Host code in a plan (the lean runtime of a version-compatible plan) runs with this process's
    # rights: it is refused unless asked for (TensorRT's own default; Polygraphy's loader turns it on).
    runtime.engine_host_code_allowed = allow_host_code
    engine = runtime.deserialize_cuda_engine(plan_path.read_bytes())
    if engine is None:
        raise PipelineError(
            f"TensorRT could not deserialize {plan_path} (its errors are logged above)",
            "rebuild the plan with this TensorRT on this GPU (python -m pipeline build); a plan that embeds host code "
            "also needs --allow-plan-host-code",
        )
    return engine


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
    # device_memory_size_v2 (10.x from 10.1, and 11.x) includes weight-streaming scratch; 11 dropped the v1
    # property, and every supported version (MIN_TENSORRT) has v2.
    return int(engine.device_memory_size_v2)
