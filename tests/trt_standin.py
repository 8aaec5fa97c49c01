"""A stand-in for TensorRT behind the pipeline's seam (pipeline.backend.trt_seam.TensorRT).

TensorRT cannot run here: it needs an NVIDIA GPU and driver, and neither can exist on these
machines. So the tests pass this implementation of the seam through ``BuildConfig.tensorrt``
(nothing is patched), and everything around TensorRT runs for real: the build's engine stage,
the plan files and their metadata, the accuracy gate's profile choice and batching, publishing.

What it does instead of TensorRT:

* ``build`` checks every argument's type and value the way TensorRT would refuse it (each shape
  range nested MIN <= OPT <= MAX, of the model's rank, fixed axes equal to the model's, every
  dynamic input in every profile and no unknown one, a known hardware-compatibility level, an
  optimization level 0..5, a workspace of at least 1 MiB) and writes a plan-shaped file: a magic
  header and JSON naming the ONNX model it stands for and the profiles. Given a ``builder`` (a real
  one: :class:`pipeline.backend.trt_rtx.RtxTensorRT`, TensorRT-RTX compiling ahead of time), it checks
  the same and then builds for real through it: the plan, timing cache and facts are the builder's,
  and the runner finds the ONNX model and profiles in the plan's metadata JSON;
* its runner refuses input shapes outside the active optimization profile (as TensorRT's
  ``set_input_shape`` does), needs ``set_profile`` to switch, and computes the outputs with ONNX
  Runtime on the same ONNX model (exact Q/DQ semantics, what TensorRT computes for INT8).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from polygraphy.backend.base import BaseRunner

from pipeline.backend.runners import runner_for_onnx
from pipeline.backend.tensorrt_env import GpuInfo
from pipeline.backend.trt_seam import (HARDWARE_LEVELS, MAX_OPTIMIZATION_LEVEL, BuiltEngine, EngineFacts, EngineRequest, IOTensor,
                                      Platform, TensorRT)
from pipeline.data.artifacts import PRECISIONS
from pipeline.data.profiles import ShapeProfile, profiles_from_json, profiles_to_json
from pipeline.data.tensors import signature_from_onnx
from pipeline.stages.engine import metadata_path

MAGIC = b"STAND-IN TENSORRT PLAN\0"
_TRT_DTYPES = {"float32": "FLOAT", "float16": "HALF", "int8": "INT8", "uint8": "UINT8", "int32": "INT32", "int64": "INT64", "bool": "BOOL"}


class StandInRefused(Exception):
    """What TensorRT would have refused (a bad argument or a shape outside the active profile)."""


def _require(ok: bool, why: str) -> None:
    if not ok:
        raise StandInRefused(why)


def _is_shape(value: Any) -> bool:
    return isinstance(value, tuple) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in value)


def check_request(request: EngineRequest) -> dict[str, tuple[int, ...]]:
    """Every argument of a build, checked as TensorRT would; returns the model's inputs (name → shape, -1 dynamic)."""
    _require(isinstance(request, EngineRequest), f"request is a {type(request).__name__}")
    _require(isinstance(request.onnx_path, Path) and request.onnx_path.is_file(), f"onnx_path {request.onnx_path!r} is not an existing Path")
    _require(request.precision in PRECISIONS, f"unknown precision {request.precision!r}")
    import onnx

    ops = {n.op_type for n in onnx.load(str(request.onnx_path), load_external_data=False).graph.node}
    _require((request.precision == "int8") == ("QuantizeLinear" in ops), f"precision {request.precision} but Q/DQ nodes: {'QuantizeLinear' in ops}")
    _require(isinstance(request.optimization_level, int) and 0 <= request.optimization_level <= MAX_OPTIMIZATION_LEVEL,
             f"optimization level {request.optimization_level!r}")
    _require(request.workspace_mib is None or (isinstance(request.workspace_mib, int) and request.workspace_mib >= 1),
             f"workspace {request.workspace_mib!r}")
    _require(isinstance(request.tf32, bool), f"tf32 {request.tf32!r} is not a bool")
    _require(request.hardware_compatibility in HARDWARE_LEVELS, f"hardware compatibility {request.hardware_compatibility!r}")
    _require(request.timing_cache is None or isinstance(request.timing_cache, bytes), "timing cache is not bytes")
    signature = signature_from_onnx(request.onnx_path)
    inputs = {s.name: tuple(d if isinstance(d, int) and d >= 0 else -1 for d in s.shape) for s in signature.inputs}
    dynamic = [name for name, shape in inputs.items() if -1 in shape]
    _require(isinstance(request.profiles, tuple), f"profiles is a {type(request.profiles).__name__}, not a tuple")
    _require(not dynamic or bool(request.profiles), f"dynamic inputs {dynamic} but no profile")
    for index, profile in enumerate(request.profiles):
        _require(isinstance(profile, ShapeProfile), f"profile {index} is a {type(profile).__name__}, not a ShapeProfile")
        _require(sorted(profile.shapes) == sorted(dynamic), f"profile {index} names {sorted(profile.shapes)}, the dynamic inputs are {dynamic}")
        for name, levels in profile.shapes.items():
            _require(isinstance(levels, tuple) and len(levels) == 3 and all(_is_shape(s) for s in levels), f"profile {index} {name}: {levels!r}")
            lo, opt, hi = levels
            model = inputs[name]
            _require(len(lo) == len(opt) == len(hi) == len(model), f"profile {index} {name}: rank differs from the model's {model}")
            for axis, (a, b, c, d) in enumerate(zip(lo, opt, hi, model)):
                _require(a <= b <= c, f"profile {index} {name} axis {axis}: {a}/{b}/{c} not MIN <= OPT <= MAX")
                _require(d < 0 or a == b == c == d, f"profile {index} {name} axis {axis}: fixed at {d} in the model, got {a}/{b}/{c}")
    return inputs


@dataclass
class StandInTensorRT:
    """The seam's stand-in (see the module docstring); ``requests`` and ``runners`` record the calls."""

    version: str = "10.16.1.11"
    gpu: GpuInfo = GpuInfo("NVIDIA H200 (stand-in)", (9, 0))
    requests: list[EngineRequest] = field(default_factory=list)
    runners: list[StandInRunner] = field(default_factory=list)
    builder: TensorRT | None = None  # a real builder for the build half (see the module docstring)
    built: list[BuiltEngine] = field(default_factory=list)  # what the real builder returned

    def status(self) -> tuple[bool, str]:
        return True, f"TensorRT stand-in {self.version} on {self.gpu.name} (TensorRT cannot run here)"

    def platform(self) -> Platform | None:
        return Platform(self.version, self.gpu)

    def build(self, request: EngineRequest) -> BuiltEngine:
        inputs = check_request(request)
        _require(request.hardware_compatibility == "NONE" or self.gpu.compute_capability >= (8, 0), "AMPERE_PLUS needs an Ampere+ GPU")
        self.requests.append(request)
        if self.builder is not None:
            built = self.builder.build(request)
            self.built.append(built)
            return built
        header = {"onnx": str(request.onnx_path), "onnx_sha256": hashlib.sha256(request.onnx_path.read_bytes()).hexdigest(),
                  "profiles": profiles_to_json(request.profiles), "tensorrt": self.version}
        plan = MAGIC + json.dumps(header).encode()
        signature = signature_from_onnx(request.onnx_path)
        io = tuple(IOTensor(s.name, mode, _TRT_DTYPES[np.dtype(s.dtype).name], tuple(d if isinstance(d, int) and d >= 0 else -1 for d in s.shape))
                   for mode, specs in (("input", signature.inputs), ("output", signature.outputs)) for s in specs)
        facts = EngineFacts(self.version, self.gpu, io, tuple(p for p in request.profiles if p.shapes), 1 << 20,
                            request.hardware_compatibility)
        assert set(inputs) == {t.name for t in io if t.mode == "input"}
        return BuiltEngine(plan, b"stand-in timing cache", facts)

    def runner(self, plan_path: Path, *, allow_host_code: bool, name: str | None = None) -> BaseRunner:
        _require(isinstance(plan_path, Path), f"plan path {plan_path!r} is not a Path")
        _require(allow_host_code is False, "host code was allowed without being asked for")
        runner = StandInRunner(plan_path, name=name)
        self.runners.append(runner)
        return runner

    def describe(self, plan_path: Path, *, allow_host_code: bool) -> str:
        _require(allow_host_code is False, "host code was allowed without being asked for")
        return "stand-in engine: " + _read_plan(plan_path)["onnx"]


def _read_plan(path: Path) -> dict[str, Any]:
    """The ONNX model and profiles a plan stands for: a stand-in plan's header, else (a real builder's plan) its metadata JSON."""
    data = Path(path).read_bytes()
    if not data.startswith(MAGIC):
        meta = metadata_path(Path(path))
        _require(meta.is_file(), f"{path} is neither a stand-in plan nor a plan with its metadata JSON")
        header: dict[str, Any] = json.loads(meta.read_text())
        _require(header["plan_sha256"] == hashlib.sha256(data).hexdigest(), f"{meta} describes another plan than {path}")
        return header
    header = json.loads(data[len(MAGIC):])
    return header


class StandInRunner(BaseRunner):  # type: ignore[misc]
    """Runs a stand-in plan with ONNX Runtime, refusing shapes outside the active profile as TensorRT does."""

    def __init__(self, plan_path: Path, name: str | None = None) -> None:
        super().__init__(name=name, prefix="stand-in-trt")
        self.plan_path = plan_path
        self.profile_log: list[int] = []  # the profile each batch ran in
        self.shape_log: list[dict[str, tuple[int, ...]]] = []  # the input shapes of each batch
        self._onnx: BaseRunner | None = None
        self._profiles: list[ShapeProfile] = []
        self._active = 0

    def activate_impl(self) -> None:
        header = _read_plan(self.plan_path)
        self._profiles = profiles_from_json(header["profiles"])
        onnx_path = Path(header["onnx"])
        import onnx

        ops = {n.op_type for n in onnx.load(str(onnx_path), load_external_data=False).graph.node}
        self._onnx = runner_for_onnx(onnx_path, exact_qdq="QuantizeLinear" in ops, name=f"{self.name}-ort")
        self._onnx.activate()
        self._active = 0

    def set_profile(self, index: int) -> None:
        _require(self.is_active, "set_profile before activation")
        _require(isinstance(index, int) and 0 <= index < max(len(self._profiles), 1), f"no optimization profile {index}")
        self._active = index

    def get_input_metadata_impl(self) -> Any:
        assert self._onnx is not None
        return self._onnx.get_input_metadata(use_numpy_dtypes=False)

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        assert self._onnx is not None
        if self._profiles:
            for name, (lo, _, hi) in self._profiles[self._active].shapes.items():
                shape = feed_dict[name].shape
                _require(len(shape) == len(lo) and all(a <= d <= b for d, a, b in zip(shape, lo, hi)),
                         f"input {name} shape {list(shape)} is outside optimization profile {self._active} ({list(lo)} .. {list(hi)})")
        self.profile_log.append(self._active)
        self.shape_log.append({name: tuple(array.shape) for name, array in feed_dict.items()})
        outputs: OrderedDict[str, np.ndarray] = self._onnx.infer(feed_dict)
        self.inference_time = self._onnx.last_inference_time()
        return outputs

    def deactivate_impl(self) -> None:
        assert self._onnx is not None
        self._onnx.deactivate()
        self._onnx, self._profiles, self._active = None, [], 0


def has_real_builder() -> bool:
    """Whether TensorRT-RTX, the real builder scripts/setup.sh installs (the ``trt-check`` extra), is here. Where it
    is missing this fails a test in CI (``CI=true``), so CI cannot pass without building for real; elsewhere False."""
    import os

    import pytest

    from pipeline.backend.trt_rtx import EXTRA_HINT, rtx_module

    if rtx_module() is not None:
        return True
    if (os.environ.get("CI") or "").strip().lower() in ("true", "1"):
        pytest.fail(f"TensorRT-RTX is not installed ({EXTRA_HINT}); CI must build with the real builder")
    return False


def real_builder(compute_capability: str = "8.0") -> TensorRT:
    """TensorRT-RTX (:class:`pipeline.backend.trt_rtx.RtxTensorRT`) for ``compute_capability``; the test skips on a
    developer's machine without it and fails in CI (:func:`has_real_builder`)."""
    import pytest

    from pipeline.backend.trt_rtx import RtxTensorRT

    if not has_real_builder():
        pytest.skip("TensorRT-RTX is not installed (pip install '.[trt-check]')")
    return RtxTensorRT(compute_capability)
