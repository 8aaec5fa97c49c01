"""TensorRT-RTX as a builder without a GPU: the real ONNX parser and builder, compiling ahead of time.

TensorRT-RTX (``pip install '.[trt-check]'``: the ``tensorrt-rtx-cu13`` wheels, module
``tensorrt_rtx``) parses ONNX graphs and builds real plans on a machine without a GPU or CUDA
driver once the builder config names a compute capability (``ComputeCapability.SM80`` …). Its plans
cannot run there, and they are not what Triton's ``tensorrt_plan`` backend loads (that is TensorRT
proper): they are never written to the model repository. What a build through it proves is that the
graph parses and builds with the profiles and settings the engine stage uses; where it differs from
TensorRT's own parser is noted in docs/tensorrt.md.

:class:`RtxTensorRT` is the build half of the :class:`~pipeline.backend.trt_seam.TensorRT` seam
(:func:`~pipeline.backend.trt_compile.compile_plan`, the code the GPU build runs); it cannot
deserialize or run plans.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.backend.tensorrt_env import GpuInfo
from pipeline.backend.trt_compile import EngineRequest, compile_plan
from pipeline.backend.trt_seam import BuiltEngine, EngineFacts, Platform
from pipeline.core.errors import PipelineError

MODULE = "tensorrt_rtx"
EXTRA_HINT = "pip install '.[trt-check]' (TensorRT-RTX from PyPI; scripts/setup.sh installs it)"
# TensorRT-RTX 1.7's ComputeCapability members (SM75, SM80, SM86, SM89, SM120, SM121), as "major.minor".
COMPUTE_CAPABILITIES = ("7.5", "8.0", "8.6", "8.9", "12.0", "12.1")
DEFAULT_COMPUTE_CAPABILITY = "8.0"  # A100, and the oldest GPU of hardware-compatible (AMPERE_PLUS) plans


def rtx_module() -> Any | None:
    """The ``tensorrt_rtx`` module, or None where it is not installed or does not load."""
    if importlib.util.find_spec(MODULE) is None:
        return None
    try:
        module = importlib.import_module(MODULE)
    except (ImportError, OSError):
        return None
    return module if hasattr(module, "Builder") else None


def rtx_version() -> str | None:
    """The installed TensorRT-RTX version, or None."""
    module = rtx_module()
    return str(module.__version__) if module is not None else None


@dataclass(frozen=True)
class RtxTensorRT:
    """The seam's build half through TensorRT-RTX, for ``compute_capability`` (one of COMPUTE_CAPABILITIES)."""

    compute_capability: str = DEFAULT_COMPUTE_CAPABILITY

    def status(self) -> tuple[bool, str]:
        version = rtx_version()
        if version is None:
            return False, f"TensorRT-RTX is not installed ({EXTRA_HINT})"
        return True, f"TensorRT-RTX {version}, ahead of time for compute capability {self.compute_capability} (no GPU needed)"

    def platform(self) -> Platform | None:
        return None  # nothing here can run a plan

    def build(self, request: EngineRequest) -> BuiltEngine:
        rtx = rtx_module()
        if rtx is None:
            raise PipelineError("TensorRT-RTX is not installed", EXTRA_HINT)
        if self.compute_capability not in COMPUTE_CAPABILITIES:
            raise PipelineError(f"TensorRT-RTX cannot build for compute capability {self.compute_capability}",
                                f"use one of: {', '.join(COMPUTE_CAPABILITIES)}")
        target = getattr(rtx.ComputeCapability, "SM" + self.compute_capability.replace(".", ""))

        def configure(config: Any) -> None:
            config.num_compute_capabilities = 1
            config.set_compute_capability(target, 0)

        compiled = compile_plan(rtx, request, where=f"(TensorRT-RTX {rtx.__version__}, compute capability {self.compute_capability})",
                                configure=configure)
        major, minor = (int(p) for p in self.compute_capability.split("."))
        facts = EngineFacts(
            tensorrt_version=str(rtx.__version__),
            gpu=GpuInfo(f"TensorRT-RTX ahead of time for SM{major}{minor} (no GPU)", (major, minor)),
            io=compiled.io,
            profiles=compiled.profiles,
            device_memory_bytes=0,  # known only once a GPU deserializes the plan
            hardware_compatibility=request.hardware_compatibility,
            strongly_typed=compiled.strongly_typed,
            layers=compiled.layers,
            timing_cache_loaded=compiled.timing_cache_loaded,
            workspace_bytes=compiled.workspace_bytes,
        )
        return BuiltEngine(compiled.plan, compiled.timing_cache, facts)

    def runner(self, plan_path: Path, *, allow_host_code: bool, name: str | None = None) -> Any:
        raise PipelineError(f"TensorRT-RTX plans cannot run here ({plan_path})", "run plans with TensorRT on an NVIDIA GPU")

    def describe(self, plan_path: Path, *, allow_host_code: bool) -> str:
        raise PipelineError(f"TensorRT-RTX plans cannot be read back here ({plan_path})", "inspect plans with TensorRT on an NVIDIA GPU")
