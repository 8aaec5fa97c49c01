"""The one seam between the pipeline and TensorRT: every call into ``tensorrt`` and into Polygraphy's
TensorRT backend is in this module or in its build half (:mod:`pipeline.backend.trt_compile`), behind
the :class:`TensorRT` interface.

* :meth:`TensorRT.build`: parse an ONNX model into a strongly typed network, build a plan with the
  given optimization profiles and settings, and read back what the engine holds
  (:class:`BuiltEngine`: plan bytes, timing cache, :class:`EngineFacts`);
* :meth:`TensorRT.runner`: a Polygraphy runner over a plan, with ``set_profile(index)``;
* :meth:`TensorRT.describe`: Polygraphy's text summary of a plan (``inspect``);
* :meth:`TensorRT.status` / :meth:`TensorRT.platform`: can engines be built here, and for what (the
  real one asks :mod:`pipeline.backend.tensorrt_env`, the availability probe: the module's version,
  the driver's CUDA version and the GPU, through ctypes).

The product uses :class:`PolygraphyTensorRT` (the default of ``BuildConfig.tensorrt``, not a
command-line option). A caller that cannot have TensorRT (the CI tests) passes another
implementation of the same interface through the config; nothing is patched.

The build half (parse, configure, build) is :func:`pipeline.backend.trt_compile.compile_plan`, which
takes the TensorRT module as an argument, so the check without a GPU (TensorRT-RTX,
:mod:`pipeline.backend.trt_rtx`) runs the same code. Deserializing is done by hand rather than by
Polygraphy's ``EngineFromBytes``, which sets ``IRuntime.engine_host_code_allowed = True`` for every
plan (loader.py, "to deserialize version compatible engines"), so a plan from elsewhere could run
its embedded host code. Here host code is allowed only when asked for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pipeline.backend.tensorrt_env import GpuInfo, cuda_gpu, require_tensorrt, tensorrt_status
from pipeline.backend.trt_compile import (HARDWARE_LEVELS, MAX_OPTIMIZATION_LEVEL, EngineRequest, IOTensor, ParseFailed, _shape,
                                         check_profiles, compile_plan)
from pipeline.core.errors import PipelineError
from pipeline.data.profiles import ShapeProfile

if TYPE_CHECKING:
    import tensorrt as trt
    from polygraphy.backend.base import BaseRunner

log = logging.getLogger(__name__)

__all__ = ["HARDWARE_LEVELS", "MAX_OPTIMIZATION_LEVEL", "BuiltEngine", "EngineFacts", "EngineRequest", "IOTensor", "ParseFailed", "Platform",
           "PolygraphyTensorRT", "TensorRT", "check_profiles"]


@dataclass(frozen=True)
class EngineFacts:
    """What a built engine holds and where it was built, read back from TensorRT."""

    tensorrt_version: str
    gpu: GpuInfo
    io: tuple[IOTensor, ...]
    profiles: tuple[ShapeProfile, ...]  # (min, opt, max) of each dynamic input, per profile
    device_memory_bytes: int
    hardware_compatibility: str  # one of HARDWARE_LEVELS, as the engine reports it
    strongly_typed: bool = True  # the network was created strongly typed (TensorRT 11: the only mode)
    layers: int | None = None  # layers of the parsed network (None: not read)
    timing_cache_loaded: bool = False  # the earlier build's timing cache applied
    workspace_bytes: int | None = None  # the WORKSPACE pool limit the builder config held (None: TensorRT's default)


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


class PolygraphyTensorRT:
    """The product's :class:`TensorRT`: the ``tensorrt`` module through Polygraphy's loaders."""

    def status(self) -> tuple[bool, str]:
        """See :func:`pipeline.backend.tensorrt_env.tensorrt_status`."""
        return tensorrt_status()

    def platform(self) -> Platform | None:
        """The installed TensorRT and GPU 0, or None if either is missing."""
        if not self.status()[0]:
            return None
        import tensorrt as trt

        return Platform(str(trt.__version__), cuda_gpu())

    def build(self, request: EngineRequest) -> BuiltEngine:
        """:func:`~pipeline.backend.trt_compile.compile_plan` with the installed ``tensorrt``, then the plan
        deserialized on this GPU to read back what the engine holds."""
        require_tensorrt()
        gpu = cuda_gpu()
        import tensorrt as trt

        if request.hardware_compatibility == "AMPERE_PLUS" and gpu.compute_capability < (8, 0):
            # TensorRT API, HardwareCompatibilityLevel.kAMPERE_PLUS: "only supported for engines built on NVIDIA Ampere and later GPUs".
            raise PipelineError(f"--hardware-compatible plans must be built on an Ampere or newer GPU; {gpu.name} has compute capability "
                                f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}",
                                "build on a GPU of compute capability 8.0 or newer, or leave out --hardware-compatible")
        log.info("building a %s TensorRT %s engine from %s on %s", request.precision, trt.__version__, request.onnx_path, gpu.name)
        compiled = compile_plan(trt, request, where=f"on {gpu.name}")
        engine = _deserialize(compiled.plan, str(request.onnx_path), allow_host_code=False)
        facts = EngineFacts(
            tensorrt_version=str(trt.__version__),
            gpu=gpu,
            io=tuple(_engine_io(engine)),
            profiles=tuple(_engine_profiles(engine)),
            device_memory_bytes=_device_memory(engine),
            hardware_compatibility=str(engine.hardware_compatibility_level.name),
            strongly_typed=compiled.strongly_typed,
            layers=compiled.layers,
            timing_cache_loaded=compiled.timing_cache_loaded,
            workspace_bytes=compiled.workspace_bytes,
        )
        return BuiltEngine(compiled.plan, compiled.timing_cache, facts)

    def runner(self, plan_path: Path, *, allow_host_code: bool, name: str | None = None) -> BaseRunner:
        """Polygraphy's TrtRunner over the plan, deserialized when the runner activates (host code
        only with ``allow_host_code``)."""
        require_tensorrt()
        from polygraphy.backend.trt import TrtRunner

        runner: BaseRunner = TrtRunner(lambda: _deserialize(Path(plan_path).read_bytes(), str(plan_path), allow_host_code), name=name)
        return runner

    def describe(self, plan_path: Path, *, allow_host_code: bool) -> str:
        """Polygraphy's ``str_from_engine`` (it takes an execution context since 0.50)."""
        require_tensorrt()
        from polygraphy.backend.trt.util import str_from_engine

        engine = _deserialize(Path(plan_path).read_bytes(), str(plan_path), allow_host_code)
        context = engine.create_execution_context()
        return str(str_from_engine(engine, context, show_layers=False))


def _deserialize(plan: bytes, where: str, allow_host_code: bool) -> trt.ICudaEngine:
    import tensorrt as trt

    from polygraphy.backend.trt.util import get_trt_logger

    logger = get_trt_logger()
    # TensorRT's standard plugins (what the ONNX parser falls back to for some ops) must be registered before a plan
    # that uses one deserializes; the build registered them while parsing, a fresh process (inspect, verify) has not.
    # Polygraphy's EngineFromBytes does the same (polygraphy/backend/trt/loader.py, 0.53.6).
    trt.init_libnvinfer_plugins(logger, "")
    runtime = trt.Runtime(logger)
    # Host code in a plan (the lean runtime of a version-compatible plan) runs with this process's
    # rights: it is refused unless asked for (TensorRT's own default; Polygraphy's loader turns it on).
    runtime.engine_host_code_allowed = allow_host_code
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise PipelineError(
            f"TensorRT could not deserialize {where} (its errors are logged above)",
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
