"""Execution providers and ONNX Runtime sessions for one instance, as Triton's C++ onnxruntime backend
builds them (:func:`execution_providers`).

A ``KIND_CPU`` instance runs on the CPU EP and ignores ``gpu_execution_accelerator``; a ``KIND_GPU`` instance
gets the TensorRT EP for a ``tensorrt`` accelerator (``precision_mode`` FP32/FP16/INT8,
``max_workspace_size_bytes`` and the ``trt_*`` keys, renamed as the C++ backend renames them), then the CUDA
EP on the instance's device with the ``cuda`` accelerator's options and the deprecated top-level CUDA
``parameters``. A GPU instance needs onnxruntime-gpu (the project's ``gpu-serve`` extra); without TensorRT's
libraries the TensorRT EP is left out with one log line, never silently.

Part of the backend folder (see ``model.py``): runs in the stub and imports nothing from ``pipeline``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils
from ort_backend_config import BackendConfigError, string_parameter

GPU_EXTRA = "gpu-serve"
# The C++ backend's renames of the tensorrt accelerator's keys (src/onnxruntime.cc); every other key it
# accepts passes through unchanged, and an unknown key fails the load.
_TRT_RENAMED = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
_TRT_KEYS = {
    "trt_max_partition_iterations", "trt_min_subgraph_size", "trt_dla_enable", "trt_dla_core", "trt_engine_cache_enable",
    "trt_engine_cache_path", "trt_engine_cache_prefix", "trt_dump_subgraphs", "trt_force_sequential_engine_build",
    "trt_context_memory_sharing_enable", "trt_layer_norm_fp32_fallback", "trt_timing_cache_enable", "trt_timing_cache_path",
    "trt_force_timing_cache", "trt_detailed_build_log", "trt_build_heuristics_enable", "trt_sparsity_enable",
    "trt_builder_optimization_level", "trt_auxiliary_streams", "trt_tactic_sources", "trt_extra_plugin_lib_paths",
    "trt_profile_min_shapes", "trt_profile_max_shapes", "trt_profile_opt_shapes", "trt_cuda_graph_enable",
    "trt_dump_ep_context_model", "trt_ep_context_file_path", "trt_ep_context_embed_mode",
}
_TRT_PRECISION = {"FP32": None, "FP16": "trt_fp16_enable", "INT8": "trt_int8_enable"}
# Deprecated top-level parameters the C++ backend still maps to CUDA EP options, with its defaults
# (applied only when the config has a ``parameters`` block at all, as there).
_CUDNN_SEARCH = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}
_ARENA_STRATEGY = {"0": "kNextPowerOfTwo", "1": "kSameAsRequested"}


def _tensorrt_options(parameters: dict[str, str], device_id: int) -> dict[str, str]:
    options: dict[str, str] = {}
    for key, value in parameters.items():
        if key == "precision_mode":
            if value not in _TRT_PRECISION:
                raise BackendConfigError(f"unsupported precision mode '{value}' is requested")
            flag = _TRT_PRECISION[value]
            if flag:
                options[flag] = "1"
        elif key in _TRT_RENAMED:
            options[_TRT_RENAMED[key]] = value
        elif key in _TRT_KEYS:
            options[key] = value
        else:
            raise BackendConfigError(f"unknown parameter '{key}' is provided for TensorRT Execution Accelerator")
    options["device_id"] = str(device_id)
    return options


def _deprecated_cuda_parameters(config: dict[str, Any]) -> dict[str, str]:
    if "parameters" not in config:
        return {}
    search = string_parameter(config, "cudnn_conv_algo_search") or "0"
    strategy = string_parameter(config, "arena_extend_strategy") or "0"
    if search not in _CUDNN_SEARCH:
        raise BackendConfigError(f"unsupported cudnn_conv_algo_search value '{search}' is requested")
    if strategy not in _ARENA_STRATEGY:
        raise BackendConfigError(f"unsupported arena_extend_strategy value '{strategy}' is requested")
    return {
        "cudnn_conv_algo_search": _CUDNN_SEARCH[search],
        "gpu_mem_limit": string_parameter(config, "gpu_mem_limit") or str(2**64 - 1),
        "arena_extend_strategy": _ARENA_STRATEGY[strategy],
        "do_copy_in_default_stream": string_parameter(config, "do_copy_in_default_stream") or "1",
    }


def execution_providers(
    config: dict[str, Any], kind: str, device_id: int, available: list[str], tensorrt_loadable: bool
) -> tuple[list[tuple[str, dict[str, str]]], list[str]]:
    """The ONNX Runtime providers (with options) for one instance, as Triton's C++ onnxruntime backend
    appends them, and notes to log. ``kind`` is the instance's ``model_instance_kind`` (``CPU``/``GPU``);
    ``available``: ``onnxruntime.get_available_providers()``; ``tensorrt_loadable``: TensorRT's
    library loads here (the onnxruntime-gpu wheel has the TensorRT EP but not TensorRT itself)."""
    if kind != "GPU":
        return [("CPUExecutionProvider", {})], []
    if "CUDAExecutionProvider" not in available:
        raise BackendConfigError(
            f"a KIND_GPU instance needs ONNX Runtime's CUDA execution provider, but this ONNX Runtime has only "
            f"{available}: install the '{GPU_EXTRA}' extra (onnxruntime-gpu in place of onnxruntime)"
        )
    accelerators = config.get("optimization", {}).get("execution_accelerators", {}).get("gpu_execution_accelerator", [])
    providers: list[tuple[str, dict[str, str]]] = []
    notes = []
    cuda: dict[str, str] = {}
    for accelerator in accelerators:
        name = accelerator.get("name", "")
        parameters = {str(k): str(v) for k, v in accelerator.get("parameters", {}).items()}
        if name == "tensorrt":
            options = _tensorrt_options(parameters, device_id)
            if "TensorrtExecutionProvider" in available and tensorrt_loadable:
                providers.append(("TensorrtExecutionProvider", options))
            else:
                notes.append("the config asks for the TensorRT accelerator but TensorRT's libraries (libnvinfer) are not "
                             "loadable here: running on the CUDA execution provider alone")
        elif name == "cuda":
            cuda.update(parameters)
        else:
            raise BackendConfigError(f"unknown Execution Accelerator '{name}' is requested")
    cuda.update(_deprecated_cuda_parameters(config))
    cuda["device_id"] = str(device_id)
    providers.append(("CUDAExecutionProvider", cuda))
    return providers, notes



def shared_arena(providers: list[tuple[str, dict[str, str]]]) -> bool:
    """Register one device arena for this process's CUDA sessions (sessions opt in with
    ``session.use_env_allocators``); False when ONNX Runtime refuses (each session keeps its own)."""
    import onnxruntime as ort

    name, options = providers[-1]
    if name != "CUDAExecutionProvider":
        return False
    device = int(options.get("device_id", 0))
    info = ort.OrtMemoryInfo("Cuda", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, device, ort.OrtMemType.DEFAULT)
    allocator = {key: options[key] for key in ("device_id", "gpu_mem_limit", "arena_extend_strategy") if key in options}
    try:
        ort.create_and_register_allocator_v2("CUDAExecutionProvider", info, allocator, ort.OrtArenaCfg(0, -1, -1, -1))
    except Exception as exc:  # an ONNX Runtime without it: more memory, same results
        pb_utils.Logger.log_warn(f"onnxruntime (python): no shared CUDA arena for the fixed-size sessions ({exc})")
        return False
    return True


# TensorRT's runtime library by major version (11, 10: either may be a CUDA 12 or 13 build), the majors the pipeline supports.
NVINFER_LIBRARIES = ("libnvinfer.so.11", "libnvinfer.so.10")


def tensorrt_loadable(libraries: tuple[str, ...] = NVINFER_LIBRARIES) -> bool:
    """Whether a TensorRT runtime library (10 or 11) can be loaded (what ONNX Runtime's TensorRT EP needs)."""
    import ctypes

    for name in libraries:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def open_session(path: Path, options: Any, providers: list[tuple[str, dict[str, str]]]) -> Any:
    """An ONNX Runtime session that runs on the first provider asked for, or a load error saying why."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # ORT raises several types; the load must fail with the cause
        raise pb_utils.TritonModelException(f"ONNX Runtime cannot load {path}: {exc}") from None
    # ONNX Runtime falls back to the next provider when one fails to start: say so, never silently.
    wanted = providers[0][0]
    if wanted not in session.get_providers():
        raise pb_utils.TritonModelException(
            f"ONNX Runtime could not start {wanted} for {path} (it runs on {session.get_providers()}); see the log above"
        )
    return session

