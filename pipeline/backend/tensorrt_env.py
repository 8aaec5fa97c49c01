"""Can a TensorRT engine be built here? The real ``tensorrt`` module (not a stub package) of a
supported version, an NVIDIA driver new enough for that TensorRT's CUDA, and a CUDA GPU seen by the
driver (through ctypes, so no CUDA toolkit is needed), with one line of why not.

The supported range (:data:`MIN_TENSORRT` up to, not including, :data:`MAX_TENSORRT`) is what the
``tensorrt`` extra in pyproject.toml pins, and what tests/backend/test_trt_api.py checks the code's TensorRT
names against (the latest 10.x and 11.x bindings). TensorRT removes APIs only at major versions
(TensorRT docs, "Version Compatibility"), so a new 11.x keeps the names checked for 11.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass

from pipeline.core.errors import PipelineError

INSTALL_HINT = "pip install --extra-index-url https://pypi.nvidia.com '.[tensorrt]' on a machine with an NVIDIA GPU"
MIN_TENSORRT = (10, 8)  # the first version the engine stage builds with (strongly typed networks, timing cache API)
MAX_TENSORRT = (12, 0)  # exclusive: the next major, whose API nobody has checked
# CUDA majors each TensorRT major's pip wheels are built for (tensorrt-cu11/-cu12/-cu13 on PyPI: tensorrt-cu11 stops at
# 10.13, tensorrt-cu12 and -cu13 carry 11.4). The CUDA is the wheel's, not the major's: the `tensorrt` metapackage
# itself pulls tensorrt_cu13 for 10.16.1.11 as for 11.4.0.106 (their pyproject.toml). Oldest Linux driver for each CUDA
# (CUDA Compatibility guide, minor-version compatibility): 11.x from 450.80.02, 12.x from 525.60.13, 13.x from r580.
CUDA_OF_TENSORRT: dict[int, tuple[int, ...]] = {10: (11, 12, 13), 11: (12, 13)}
DRIVER_FOR_CUDA = {11: "r450 (450.80.02)", 12: "r525 (525.60.13)", 13: "r580"}
_WHEEL = re.compile(r"tensorrt[-_]cu(\d+)(?:[-_](libs|bindings))?")

# CUDA driver API (cuda.h): CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR.
_CU_CC_MAJOR, _CU_CC_MINOR = 75, 76
_LIBCUDA = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")


@dataclass(frozen=True)
class GpuInfo:
    """A CUDA device as the driver reports it."""

    name: str
    compute_capability: tuple[int, int]
    index: int = 0


# -------------------------------------------------------------


def tensorrt_version_tuple(text: str) -> tuple[int, int]:
    """``"10.16.1.11"`` → ``(10, 16)``."""
    parts = (text.split(".") + ["0"])[:2]
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


def _tensorrt_problem() -> tuple[str, str] | None:
    """(problem, fix) if the ``tensorrt`` module cannot build engines, else None."""
    spec = importlib.util.find_spec("tensorrt")
    if spec is None:
        return "the Python module 'tensorrt' is not installed", INSTALL_HINT
    try:
        module = importlib.import_module("tensorrt")
    except (ImportError, OSError) as exc:  # OSError: the wheel's CUDA/TensorRT libraries do not load
        gpu = _probe_gpu()
        if isinstance(gpu, str):  # the likelier cause, and the one to fix first
            return gpu, "run the engine step on a machine with an NVIDIA GPU and driver"
        return f"importing the Python module 'tensorrt' failed ({type(exc).__name__}: {exc})", f"reinstall it: {INSTALL_HINT}"
    if not hasattr(module, "Builder"):
        where = ", ".join(spec.submodule_search_locations or []) or spec.origin or "?"
        return (
            f"the 'tensorrt' package at {where} has no Builder: it is an empty namespace package, typically "
            "type stubs (tensorrt-stubs) installed into site-packages",
            f"pip uninstall tensorrt-stubs (keep stubs in a separate MYPYPATH dir, see .ci/mypy-engine.sh), then {INSTALL_HINT}",
        )
    version = str(getattr(module, "__version__", "0.0"))
    if tensorrt_version_tuple(version) < MIN_TENSORRT:
        wanted = ".".join(map(str, MIN_TENSORRT))
        return f"TensorRT {version} is older than {wanted}, the first version this pipeline builds with", INSTALL_HINT
    if tensorrt_version_tuple(version) >= MAX_TENSORRT:
        return (f"TensorRT {version} is newer than the versions this pipeline is checked against (below {MAX_TENSORRT[0]})",
                f"pip install 'tensorrt<{MAX_TENSORRT[0]}' (the range the 'tensorrt' extra pins)")
    driver, cuda = _driver_cuda_version(), tensorrt_wheel_cuda()
    if driver is not None and cuda is not None:
        return driver_problem(version, cuda, driver)
    return None


def tensorrt_wheel_cuda(names: list[str] | None = None) -> int | None:
    """The CUDA major of the installed TensorRT pip wheels (``tensorrt_cu13_libs`` → 13), read from the installed
    distributions' names (``names``: those names instead); None when TensorRT did not come from such wheels (a
    tarball, an NGC container: no driver check then, TensorRT's own error names the CUDA problem)."""
    if names is None:
        from importlib import metadata

        names = [str(d.metadata["Name"] or "") for d in metadata.distributions()]
    found = {(m[2] or "", int(m[1])) for n in names if (m := _WHEEL.fullmatch(n.lower()))}
    for part in ("libs", "bindings", ""):  # the libraries are what the driver runs
        majors = sorted(c for p, c in found if p == part)
        if majors:
            return majors[-1]
    return None


def driver_problem(tensorrt_version: str, tensorrt_cuda: int, driver_cuda: int) -> tuple[str, str] | None:
    """(problem, fix) when a driver whose CUDA version is ``driver_cuda`` (cuDriverGetVersion: 12080 for
    12.8) is too old for TensorRT ``tensorrt_version`` built for CUDA ``tensorrt_cuda``; None when it is new enough."""
    if driver_cuda >= tensorrt_cuda * 1000:
        return None
    have_major = driver_cuda // 1000
    have = f"{have_major}.{driver_cuda % 1000 // 10}"
    majors = [m for m, cudas in sorted(CUDA_OF_TENSORRT.items()) if have_major in cudas]
    lowest = ".".join(map(str, MIN_TENSORRT))
    instead = f", or the TensorRT wheels for CUDA {have_major} (pip install 'tensorrt-cu{have_major}>={lowest},<{majors[-1] + 1}')" \
        if majors else ""
    needs = DRIVER_FOR_CUDA.get(tensorrt_cuda, f"for CUDA {tensorrt_cuda}")
    return (f"TensorRT {tensorrt_version} is built for CUDA {tensorrt_cuda}, but the NVIDIA driver supports CUDA {have} at most",
            f"install NVIDIA driver {needs} or newer{instead}")


def _load_libcuda() -> ctypes.CDLL | str:
    """The CUDA driver library, or why it does not load."""
    errors = []
    for name in _LIBCUDA:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    return f"no CUDA GPU found (the NVIDIA driver library {_LIBCUDA[0]} is not loadable: {errors[0]})"


def _driver_cuda_version() -> int | None:
    """The CUDA version the driver supports (``cuDriverGetVersion``, e.g. 12080); None without a driver."""
    lib = _load_libcuda()
    if isinstance(lib, str):
        return None
    version = ctypes.c_int(0)
    if int(lib.cuDriverGetVersion(ctypes.byref(version))) != 0:
        return None
    return int(version.value)


def _probe_gpu(index: int = 0) -> GpuInfo | str:
    """GPU ``index`` via the CUDA driver library (ctypes, no CUDA toolkit needed), or why there is none."""
    lib = _load_libcuda()
    if isinstance(lib, str):
        return lib

    def failed(result: int, call: str) -> str | None:
        if result == 0:
            return None
        text = ctypes.c_char_p()
        lib.cuGetErrorString(result, ctypes.byref(text))
        detail = (text.value or b"unknown error").decode(errors="replace")
        return f"no CUDA GPU found ({call} returned CUDA error {result}: {detail})"

    count = ctypes.c_int(0)
    problem = failed(int(lib.cuInit(0)), "cuInit") or failed(int(lib.cuDeviceGetCount(ctypes.byref(count))), "cuDeviceGetCount")
    if problem:
        return problem
    if count.value <= index:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" with CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        return f"no CUDA GPU found (the driver reports {count.value} device(s){hint}, GPU {index} was asked for)"
    device = ctypes.c_int(0)
    name_buf = ctypes.create_string_buffer(256)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    problem = (
        failed(int(lib.cuDeviceGet(ctypes.byref(device), index)), "cuDeviceGet")
        or failed(int(lib.cuDeviceGetName(name_buf, len(name_buf), device)), "cuDeviceGetName")
        or failed(int(lib.cuDeviceGetAttribute(ctypes.byref(major), _CU_CC_MAJOR, device)), "cuDeviceGetAttribute")
        or failed(int(lib.cuDeviceGetAttribute(ctypes.byref(minor), _CU_CC_MINOR, device)), "cuDeviceGetAttribute")
    )
    if problem:
        return problem
    return GpuInfo(name_buf.value.decode(errors="replace"), (major.value, minor.value), index)


def gpu_here() -> bool:
    """Whether the CUDA driver sees a GPU here (a CPU-only machine has nothing to warn about engines or GPUs)."""
    return isinstance(_probe_gpu(), GpuInfo)


def cuda_gpu(index: int = 0) -> GpuInfo:
    """Name and compute capability of CUDA device ``index``; PipelineError if there is no usable GPU."""
    gpu = _probe_gpu(index)
    if isinstance(gpu, str):
        raise PipelineError(gpu, "build TensorRT engines on a machine with an NVIDIA GPU and driver")
    return gpu


def tensorrt_status() -> tuple[bool, str]:
    """Whether a TensorRT engine can be built here, and one line saying why (not).

    Checks that the real ``tensorrt`` module imports (not an empty stub package) and that the
    CUDA driver sees a GPU. Cheap: nothing is built and no CUDA context is kept.
    """
    problem = _tensorrt_problem()
    if problem is None:
        gpu = _probe_gpu()
        if isinstance(gpu, GpuInfo):
            import tensorrt as trt

            cc = ".".join(map(str, gpu.compute_capability))
            return True, f"TensorRT {trt.__version__} on GPU {gpu.index}: {gpu.name} (compute capability {cc})"
        problem = gpu, "run the engine step on a machine with an NVIDIA GPU and driver"
    text, fix = problem
    return False, f"TensorRT engine step not run: {text} ({fix}); building ONNX variants only"


def require_tensorrt() -> None:
    """Raise PipelineError (one line) unless a supported TensorRT imports and the driver can run it."""
    problem = _tensorrt_problem()
    if problem is not None:
        raise PipelineError(f"the TensorRT engine step cannot run: {problem[0]}", problem[1])
