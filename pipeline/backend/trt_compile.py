"""The build half of the TensorRT seam: ONNX → strongly typed network → builder config → serialized plan.

:func:`compile_plan` takes the TensorRT module as an argument: the product's seam
(:class:`~pipeline.backend.trt_seam.PolygraphyTensorRT`) passes ``tensorrt`` and reads the engine
back on its GPU; the check without a GPU (:mod:`pipeline.backend.trt_rtx`) passes ``tensorrt_rtx``,
whose builder compiles ahead of time for a named compute capability. Both run this same code: the
network and its creation flag, the optimization profiles, optimization level, workspace limit,
TF32, hardware compatibility and timing cache. Every name used here exists in TensorRT 10 and 11
(tests/backend/test_trt_api.py) and in TensorRT-RTX 1.7.

Precision comes from the ONNX graph (FP16 tensors, explicit INT8 Q/DQ), never from builder flags:
the network is strongly typed and no ``BuilderFlag.FP16``/``INT8`` is set (TensorRT 11 removed
both, and strongly typed is its only mode; TensorRT-RTX networks are always strongly typed).

The timing cache is attached by hand (Polygraphy's ``load_timing_cache`` ignores the result of
``set_timing_cache``, and its ``save_timing_cache`` merges a foreign cache in with
``ignore_mismatch=True``): a cache written by another TensorRT version or GPU is replaced by a fresh
one with a warning. A graph the ONNX parser refuses raises :class:`ParseFailed`, one line per
refused node: its index, name and op, and the parser's own words.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.backend.tensorrt_env import tensorrt_version_tuple
from pipeline.core.errors import PipelineError
from pipeline.data.profiles import Shape, ShapeProfile, format_shape_spec

if TYPE_CHECKING:
    import tensorrt as trt

log = logging.getLogger(__name__)

MAX_OPTIMIZATION_LEVEL = 5
# TensorRT's HardwareCompatibilityLevel names this pipeline builds with ("NONE": this GPU's architecture only).
HARDWARE_LEVELS = ("NONE", "AMPERE_PLUS")
# What TensorRT-RTX logs on a machine without a CUDA driver while it compiles ahead of time (expected there).
_NO_DRIVER = ("CUDA driver version is insufficient", "cudaError 35", "Thread context has not been set")
_SOURCE_LOCATION = re.compile(r"\s*In \w+ at /\S+:\d+")


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
class CompiledPlan:
    """A serialized plan and what the builder was given, read back from the network and config."""

    plan: bytes
    timing_cache: bytes
    timing_cache_loaded: bool  # the request's timing cache applied (False: started empty)
    strongly_typed: bool  # the network was created strongly typed (TensorRT 11: the only mode)
    layers: int  # layers of the parsed network
    io: tuple[IOTensor, ...]  # the network's inputs and outputs
    profiles: tuple[ShapeProfile, ...]  # read back from the optimization profiles added to the config
    workspace_bytes: int | None  # the WORKSPACE pool limit read back from the config (None: not set)


@dataclass(frozen=True)
class ParserFailure:
    """One node TensorRT's ONNX parser refused: index, name, op, and the parser's words."""

    node: int
    name: str
    op: str
    message: str

    def line(self) -> str:
        return f"node {self.node} '{self.name}' ({self.op}): {self.message}"


class ParseFailed(PipelineError):
    """TensorRT's ONNX parser refused the graph; ``failures`` holds each refused node."""

    def __init__(self, problem: str, fix: str | None = None, failures: tuple[ParserFailure, ...] = ()) -> None:
        super().__init__(problem, fix)
        self.failures = failures


def parser_words(desc: str) -> str:
    """The parser's description of an error as one line: without the "Invalid Node" header (the node is named
    beside it), the missing-driver lines of an ahead-of-time build, and source locations."""
    lines = [line.strip() for line in str(desc).splitlines() if line.strip()]
    lines = [line for line in lines if not any(n in line for n in _NO_DRIVER)] or lines
    lines = [line for line in lines if not line.startswith("Invalid Node - ")] or lines
    return "; ".join(_SOURCE_LOCATION.sub("", line) for line in lines)


def _shape(dims: trt.Dims) -> Shape:
    return tuple(int(dims[i]) for i in range(len(dims)))


def check_profiles(inputs: dict[str, Shape], profiles: Sequence[ShapeProfile]) -> list[ShapeProfile]:
    """The profiles to build with, checked against the network's inputs (name → shape, -1 dynamic):
    TensorRT would fill nothing in for missing inputs and refuse bad ranges with a less direct message."""
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


def trt_logger(trt: Any) -> Any:
    """A TensorRT logger (of module ``trt``) that passes TensorRT's messages to Python logging and keeps its errors
    (``.errors``) for the one-line failure; a TensorRT-RTX build's missing-driver messages are logged at debug level."""

    class Logger(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            text = str(msg)
            if any(n in text for n in _NO_DRIVER):
                log.debug("TensorRT: %s", text)
            elif severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                self.errors.append(text)
                log.debug("TensorRT: %s", text)  # said once, in the failure's line
            elif severity == trt.ILogger.Severity.WARNING:
                log.info("TensorRT: %s", text)
            else:
                log.debug("TensorRT: %s", text)

    return Logger()


def _network_flags(trt: Any) -> int:
    # TensorRT 10 needs the STRONGLY_TYPED creation flag; in 11 strongly typed is the only mode (TensorRT-RTX 1.x: 1 < 11).
    return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if _major(trt.__version__) < 11 else 0


def _major(version: str) -> int:
    return tensorrt_version_tuple(version)[0]


def _parse(trt: Any, logger: Any, onnx_path: Path, where: str) -> tuple[Any, Any, Any, bool]:
    """Builder, strongly typed network, parser (``parse_from_file``, so external weights are found), and whether the
    network is strongly typed; :class:`ParseFailed` naming each refused node."""
    trt.init_libnvinfer_plugins(logger, "")  # the ONNX parser falls back to TensorRT's standard plugins for some ops
    builder = trt.Builder(logger)
    flags = _network_flags(trt)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        failures = tuple(ParserFailure(int(e.node()), str(e.node_name()), str(e.node_operator()),
                                       f"{e.code().name} in {e.func()}: {parser_words(e.desc())}")
                         for e in (parser.get_error(i) for i in range(parser.num_errors)))
        text = "; ".join(f.line() for f in failures) or (logger.errors[-1] if logger.errors else "no error given")
        raise ParseFailed(f"TensorRT {trt.__version__}'s ONNX parser refused {onnx_path.name} {where}: {text}",
                          "see which op and type the parser names; keep that node's ONNX variant on ONNX Runtime, or change the model",
                          failures)
    strongly_typed = _major(trt.__version__) >= 11 or bool(flags) and bool(network.get_flag(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    return builder, network, parser, strongly_typed


def _attach_timing_cache(config: trt.IBuilderConfig, data: bytes | None) -> bool:
    """Load the previous build's timing cache (or start an empty one) so repeated builds skip tactic timing;
    whether the previous one applied. (TensorRT-RTX takes the calls and ignores the cache, with a DeprecationWarning.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return _set_timing_cache(config, data)


def _set_timing_cache(config: trt.IBuilderConfig, data: bytes | None) -> bool:
    if data:
        cache = config.create_timing_cache(data)
        if cache is not None and config.set_timing_cache(cache, ignore_mismatch=False):
            log.info("using the timing cache of an earlier build")
            return True
        # Made by another TensorRT version or GPU (or truncated): its timings do not apply here.
        log.warning("the timing cache does not match this TensorRT/GPU; starting a fresh one")
    config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
    return False


def compile_plan(trt: Any, request: EngineRequest, *, where: str, configure: Callable[[Any], None] | None = None) -> CompiledPlan:
    """Parse ``request.onnx_path`` with module ``trt`` and build a serialized plan with the request's profiles and
    settings; ``configure`` adjusts the builder config last (TensorRT-RTX's compute capability). ``where`` ends
    messages ("on NVIDIA H200"). :class:`ParseFailed` when the parser refuses the graph, PipelineError when the
    builder fails."""
    logger = trt_logger(trt)
    builder, network, parser, strongly_typed = _parse(trt, logger, request.onnx_path, where)
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    used = check_profiles({t.name: _shape(t.shape) for t in inputs}, request.profiles)
    config = builder.create_builder_config()
    profiles = []
    for profile in used:
        built = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile.shapes.items():
            built.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(built)
        profiles.append(ShapeProfile({name: tuple(_shape(d) for d in built.get_shape(name)) for name in profile.shapes}))  # type: ignore[misc]
    config.builder_optimization_level = request.optimization_level
    if request.workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, request.workspace_mib << 20)
    if request.tf32:
        config.set_flag(trt.BuilderFlag.TF32)
    else:
        config.clear_flag(trt.BuilderFlag.TF32)
    if request.hardware_compatibility != "NONE":
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, request.hardware_compatibility)
    loaded = _attach_timing_cache(config, request.timing_cache)
    if configure is not None:
        configure(config)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        why = "; ".join(parser_words(e) for e in logger.errors[-2:]) or "no error given"
        raise PipelineError(f"TensorRT {trt.__version__} could not build the {request.precision} plan from {request.onnx_path} {where}: {why}",
                            "try a lower --optimization-level or a larger --workspace, or check the ONNX graph with polygraphy")
    io = tuple(IOTensor(t.name, mode, str(t.dtype.name), _shape(t.shape))
               for mode, tensors in (("input", inputs), ("output", [network.get_output(i) for i in range(network.num_outputs)]))
               for t in tensors)
    workspace = int(config.get_memory_pool_limit(trt.MemoryPoolType.WORKSPACE)) if request.workspace_mib is not None else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cache = bytes(config.get_timing_cache().serialize())
    compiled = CompiledPlan(bytes(serialized), cache, loaded, strongly_typed,
                            int(network.num_layers), io, tuple(profiles), workspace)
    del parser, network  # the parser owns the weights the network pointed to; the plan has its own copy
    return compiled
