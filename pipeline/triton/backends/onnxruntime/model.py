"""A Python-based Triton backend named ``onnxruntime`` that serves ONNX models with ONNX Runtime on CPU.

Production Triton serves ``platform: "onnxruntime_onnx"`` models with its C++ ONNX Runtime backend; the
embedded ``tritonserver`` from the nvidia-pytriton wheel ships only the Python backend. Triton resolves
that platform to the backend name ``onnxruntime`` and, finding ``<backend-directory>/onnxruntime/model.py``
instead of ``libtriton_onnxruntime.so``, runs this file in a Python backend stub. So the same repository
loads unchanged here and in production.

It reads the model configuration the way the C++ backend does:

* the model file is ``<version>/<default_model_filename>`` (``model.onnx`` if unset);
* ``optimization { graph { level } }``: unset/0 → ORT_ENABLE_ALL, -1 → ORT_ENABLE_BASIC,
  1 → ORT_ENABLE_EXTENDED, 2 → ORT_DISABLE_ALL (onnxruntime_backend ``src/onnxruntime.cc``);
* ``parameters``: ``intra_op_thread_count``, ``inter_op_thread_count``, ``execution_mode`` (0 sequential,
  1 parallel), ``enable_mem_arena``, ``enable_mem_pattern``, each a ``string_value``;
* execution providers per instance (:func:`execution_providers`): a ``KIND_CPU`` instance runs on the CPU
  EP and ignores ``gpu_execution_accelerator``; a ``KIND_GPU`` instance gets the TensorRT EP for a
  ``tensorrt`` accelerator (``precision_mode`` FP32/FP16/INT8, ``max_workspace_size_bytes`` and the
  ``trt_*`` keys, renamed as the C++ backend renames them), then the CUDA EP on the instance's device
  with the ``cuda`` accelerator's options and the deprecated top-level CUDA ``parameters``. A GPU
  instance needs onnxruntime-gpu (the project's ``gpu-serve`` extra); without TensorRT's libraries the
  TensorRT EP is left out with one log line, never silently.

Requests of one dynamic batch whose inputs have equal per-sample shapes run as one ONNX Runtime call
and are split back. A failing request gets its own error response; it never takes the stub down.

Fixed batch sizes (:func:`fixed_batch_sizes`): ONNX Runtime's CUDA execution provider (1.20 and later,
cuDNN 9's frontend API) rebuilds every Conv's cuDNN execution plan whenever the Conv's input shape differs
from its previous call's, seen before or not (``UpdateState`` in ``core/providers/cuda/nn/conv.cc``;
microsoft/onnxruntime#23006). The dynamic batcher forms a different batch size at almost every execution,
so a CNN on a GPU instance spent seconds per execution rebuilding plans with the GPU idle (MobileNetV2 on
an H200: 2.5–4 s). Such an instance therefore runs every batch at one of a few fixed sizes, one ONNX
Runtime session per size (each Conv then always sees one shape), the batch padded up with copies of its
last row and the padding cut from the outputs. The sessions share one device memory arena. The
``fixed_batch_sizes`` parameter overrides the choice (``off``, or sizes such as ``1,8,32,128``).

This file runs inside the stub, in the project's venv, and imports nothing from the ``pipeline`` package.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

# The C++ backend's mapping (not ONNX Runtime's enum order): -1 basic, 1 extended, 2 disable all.
GRAPH_LEVELS = {
    0: "ORT_ENABLE_ALL",
    -1: "ORT_ENABLE_BASIC",
    1: "ORT_ENABLE_EXTENDED",
    2: "ORT_DISABLE_ALL",
}

# ONNX Runtime's type strings → Triton data types, to check the config against the model at load.
_ORT_TO_TRITON = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING",
}


_NUMPY_TYPES = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
}
# Ops whose CUDA kernels rebuild a cuDNN frontend plan on every input-shape change.
_PLAN_PER_SHAPE_OPS = {"Conv", "ConvTranspose", "FusedConv", "NhwcConv"}
FIXED_BATCH_SIZES = "fixed_batch_sizes"


def _string_parameter(config: dict[str, Any], key: str) -> str | None:
    value = config.get("parameters", {}).get(key)
    return None if value is None else str(value.get("string_value", ""))


def _int_parameter(config: dict[str, Any], key: str, allowed: tuple[int, ...] | None = None) -> int | None:
    text = _string_parameter(config, key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise pb_utils.TritonModelException(f"parameter '{key}' must be an integer string, got '{text}'") from None
    if value < 0 or (allowed is not None and value not in allowed):
        expected = f"one of {allowed}" if allowed else "a non-negative integer"
        raise pb_utils.TritonModelException(f"parameter '{key}' must be {expected}, got {value}")
    return value


def _bool_parameter(config: dict[str, Any], key: str) -> bool | None:
    text = _string_parameter(config, key)
    if text is None:
        return None
    if text.lower() in ("1", "true", "on", "yes"):
        return True
    if text.lower() in ("0", "false", "off", "no"):
        return False
    raise pb_utils.TritonModelException(f"parameter '{key}' must be a boolean string (1/0, true/false), got '{text}'")


class BackendConfigError(ValueError):
    """A model config this backend cannot serve as asked (raised as TritonModelException at load)."""


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
    search = _string_parameter(config, "cudnn_conv_algo_search") or "0"
    strategy = _string_parameter(config, "arena_extend_strategy") or "0"
    if search not in _CUDNN_SEARCH:
        raise BackendConfigError(f"unsupported cudnn_conv_algo_search value '{search}' is requested")
    if strategy not in _ARENA_STRATEGY:
        raise BackendConfigError(f"unsupported arena_extend_strategy value '{strategy}' is requested")
    return {
        "cudnn_conv_algo_search": _CUDNN_SEARCH[search],
        "gpu_mem_limit": _string_parameter(config, "gpu_mem_limit") or str(2**64 - 1),
        "arena_extend_strategy": _ARENA_STRATEGY[strategy],
        "do_copy_in_default_stream": _string_parameter(config, "do_copy_in_default_stream") or "1",
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


def fixed_batch_sizes(
    config: dict[str, Any], providers: list[tuple[str, dict[str, str]]], plan_per_shape: bool
) -> list[int]:
    """The batch sizes an instance runs every batch at (empty: as the batch comes).

    ``providers``: the instance's (:func:`execution_providers`); ``plan_per_shape``: the model has ops
    whose CUDA kernels rebuild a plan per input shape (Conv). By default a batched model with such ops
    on the CUDA provider without TensorRT gets the powers of two below its max batch, its preferred
    sizes and the max; the ``fixed_batch_sizes`` parameter says ``off`` or lists sizes (the max batch is
    always added, so every batch the server forms has a size to run at)."""
    max_batch = int(config.get("max_batch_size", 0))
    text = (_string_parameter(config, FIXED_BATCH_SIZES) or "auto").strip().lower()
    if max_batch <= 1 or text in ("off", "0", "none", ""):
        return []
    if text == "auto":
        names = [name for name, _ in providers]
        if not plan_per_shape or "CUDAExecutionProvider" not in names or "TensorrtExecutionProvider" in names:
            return []
        preferred = config.get("dynamic_batching", {}).get("preferred_batch_size", [])
        sizes = {1 << k for k in range(max_batch.bit_length()) if 1 << k < max_batch} | {int(p) for p in preferred}
    else:
        try:
            sizes = {int(part) for part in text.split(",") if part.strip()}
        except ValueError:
            raise BackendConfigError(
                f"parameter '{FIXED_BATCH_SIZES}' must be 'auto', 'off' or batch sizes like '1,8,32', got '{text}'"
            ) from None
        if any(size < 1 or size > max_batch for size in sizes):
            raise BackendConfigError(f"parameter '{FIXED_BATCH_SIZES}' sizes must lie in 1..{max_batch} (max_batch_size), got '{text}'")
    return sorted(sizes | {max_batch})


def size_for(rows: int, sizes: list[int]) -> int:
    """The smallest fixed size that holds ``rows`` (``rows`` itself when none does or none are fixed)."""
    return next((size for size in sizes if size >= rows), rows)


def padded(feed: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """``feed`` with every input grown to ``size`` rows by repeating its last row (real data, so no
    op sees values a request could not send)."""
    out = {}
    for name, array in feed.items():
        missing = size - array.shape[0]
        out[name] = array if missing <= 0 else np.concatenate([array, np.repeat(array[-1:], missing, axis=0)])
    return out


def warmup_feed(config: dict[str, Any], size: int) -> dict[str, np.ndarray] | None:
    """Zeros of ``size`` rows for every configured input, or None when a dimension is variable."""
    feed = {}
    for entry in config.get("input", []):
        dims = [int(d) for d in entry.get("reshape", {}).get("shape", entry["dims"])]
        dtype = _NUMPY_TYPES.get(entry["data_type"])
        if dtype is None or any(d < 0 for d in dims):
            return None
        feed[entry["name"]] = np.zeros([size, *dims], dtype=dtype)
    return feed


def plan_per_shape(path: Path) -> bool:
    """Whether the ONNX graph (its main graph) has ops that rebuild a cuDNN plan per input shape."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # unreadable: ONNX Runtime's load says why, in its own words
        return False
    return any(node.op_type in _PLAN_PER_SHAPE_OPS for node in graph.node)


def _shared_arena(providers: list[tuple[str, dict[str, str]]]) -> bool:
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


def graph_level_name(config: dict[str, Any]) -> str:
    """The ONNX Runtime optimization level the C++ backend would use for this model config."""
    graph = config.get("optimization", {}).get("graph")
    if graph is None:
        return GRAPH_LEVELS[0]
    level = int(graph.get("level", 0))
    # The C++ backend treats any other value like "unset".
    return GRAPH_LEVELS.get(level, GRAPH_LEVELS[0])


def session_options_from_config(config: dict[str, Any]) -> Any:
    """ONNX Runtime session options from the model config, as the C++ onnxruntime backend reads them."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, graph_level_name(config))
    mode = _int_parameter(config, "execution_mode", allowed=(0, 1))
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    intra = _int_parameter(config, "intra_op_thread_count")
    if not intra:
        # The server may be pinned to a share of the cores (a MIG rehearsal): size the pool to that
        # share instead of to the machine, and ORT then leaves thread affinity alone.
        allowed = len(os.sched_getaffinity(0))
        if allowed < (os.cpu_count() or allowed):
            intra = allowed
    if intra:
        options.intra_op_num_threads = intra
    inter = _int_parameter(config, "inter_op_thread_count")
    if inter:
        options.inter_op_num_threads = inter
    arena = _bool_parameter(config, "enable_mem_arena")
    if arena is not None:
        options.enable_cpu_mem_arena = arena
    pattern = _bool_parameter(config, "enable_mem_pattern")
    if pattern is not None:
        options.enable_mem_pattern = pattern
    return options


def _check_io(kind: str, configured: list[dict[str, Any]], actual: list[Any], batched: bool) -> None:
    """Fail the load with a clear message when the config and the ONNX file disagree."""
    by_name = {node.name: node for node in actual}
    for entry in configured:
        name = entry["name"]
        node = by_name.get(name)
        if node is None:
            raise pb_utils.TritonModelException(
                f"config {kind} '{name}' is not a {kind} of the ONNX model (it has: {', '.join(by_name)})"
            )
        expected = _ORT_TO_TRITON.get(node.type, node.type)
        if entry["data_type"] != expected:
            raise pb_utils.TritonModelException(
                f"config {kind} '{name}' is {entry['data_type']} but the ONNX model's is {expected}"
            )
        if "reshape" in entry:
            continue
        dims = [int(d) for d in entry["dims"]]
        model_dims = list(node.shape)
        if batched:
            model_dims = model_dims[1:]
        if len(model_dims) != len(dims) or any(
            isinstance(m, int) and m >= 0 and d >= 0 and m != d for m, d in zip(model_dims, dims, strict=True)
        ):
            batch = "[batch] + " if batched else ""
            raise pb_utils.TritonModelException(
                f"config {kind} '{name}' has dims {batch}{dims} but the ONNX model's shape is {list(node.shape)}"
            )
    if kind == "input":
        missing = sorted(set(by_name) - {entry["name"] for entry in configured})
        if missing:
            raise pb_utils.TritonModelException(f"the ONNX model's inputs {missing} are missing from the config")


class TritonPythonModel:
    """One model instance: an ONNX Runtime session for the model file, fed by Triton's batches."""

    def initialize(self, args: dict[str, str]) -> None:
        import onnxruntime as ort

        config = json.loads(args["model_config"])
        filename = config.get("default_model_filename") or "model.onnx"
        # Resolved: the server may see the model through a symlinked view; messages name the real file.
        path = (Path(args["model_repository"]) / args["model_version"] / filename).resolve()
        options = session_options_from_config(config)
        kind = args.get("model_instance_kind", "CPU")
        try:
            providers, notes = execution_providers(
                config, kind, int(args.get("model_instance_device_id", 0)), ort.get_available_providers(),
                kind == "GPU" and tensorrt_loadable(),
            )
        except BackendConfigError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None
        for note in notes:
            pb_utils.Logger.log_warn(f"onnxruntime (python) {path}: {note}")
        self._batched = int(config.get("max_batch_size", 0)) > 0
        try:
            self._sizes = fixed_batch_sizes(config, providers, self._batched and plan_per_shape(path))
        except BackendConfigError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None
        shared = bool(self._sizes) and _shared_arena(providers)
        if shared:
            options.add_session_config_entry("session.use_env_allocators", "1")
        try:
            self._session = _session(path, options, providers)
        except pb_utils.TritonModelException as exc:
            if not shared:
                raise
            # Without the shared arena: more memory, same results (a real load error fails again, as itself).
            pb_utils.Logger.log_warn(f"onnxruntime (python) {path}: sessions keep their own arenas ({exc})")
            options = session_options_from_config(config)
            self._session = _session(path, options, providers)
        _check_io("input", config.get("input", []), self._session.get_inputs(), self._batched)
        _check_io("output", config.get("output", []), self._session.get_outputs(), self._batched)
        self._inputs = [(entry["name"], entry.get("reshape", {}).get("shape")) for entry in config.get("input", [])]
        self._outputs = [entry["name"] for entry in config.get("output", [])]
        self._sessions = self._fixed_size_sessions(config, path, options, providers) if self._sizes else {}
        pb_utils.Logger.log_info(
            f"onnxruntime (python) loaded {path}: graph_optimization_level={graph_level_name(config)} "
            f"intra_op_threads={options.intra_op_num_threads or 'default'} "
            f"inter_op_threads={options.inter_op_num_threads or 'default'} batched={self._batched} "
            f"kind={kind} providers={','.join(self._session.get_providers())} "
            f"fixed_batch_sizes={','.join(map(str, self._sizes)) or 'off'} "
            f"onnxruntime={ort.__version__} python={sys.version.split()[0]} prefix={sys.prefix}"
        )

    def _fixed_size_sessions(self, config: dict[str, Any], path: Path, options: Any, providers: list[tuple[str, dict[str, str]]]) -> dict[int, Any]:
        """One session per fixed batch size (the largest is the instance's own), each run once at its
        size now, so each Conv builds its one plan at load rather than under the first requests."""
        sessions = {self._sizes[-1]: self._session}
        for size in self._sizes[:-1]:
            sessions[size] = _session(path, options, providers)
        for size, session in sessions.items():
            feed = warmup_feed(config, size)
            try:
                if feed is not None:
                    session.run(self._outputs or None, feed)
            except Exception as exc:
                raise pb_utils.TritonModelException(f"ONNX Runtime cannot run {path} at batch size {size}: {exc}") from None
        return sessions

    def _run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """ONNX Runtime on ``feed``, at a fixed batch size when the instance has them."""
        if not self._sessions or not feed:
            return self._session.run(self._outputs, feed)
        rows = next(iter(feed.values())).shape[0]
        size = size_for(rows, self._sizes)
        session = self._sessions.get(size, self._session)
        return [out[:rows] for out in session.run(self._outputs, padded(feed, size))]

    def execute(self, requests: list[Any]) -> list[Any]:
        """Run each group of shape-compatible requests as one ONNX Runtime call; errors stay per request."""
        responses: list[Any] = [None] * len(requests)
        groups: dict[tuple[Any, ...], list[tuple[int, dict[str, np.ndarray]]]] = {}
        for index, request in enumerate(requests):
            try:
                feed = self._feed(request)
            except Exception as exc:
                responses[index] = _error_response(exc)
                continue
            # Only batched models with equal per-sample shapes can be concatenated.
            key = (
                tuple((name, array.dtype.str, array.shape[1:]) for name, array in sorted(feed.items()))
                if self._batched
                else (index,)
            )
            groups.setdefault(key, []).append((index, feed))
        for members in groups.values():
            self._run_group(members, responses)
        return responses

    def finalize(self) -> None:
        self._session = None
        self._sessions = {}

    def _feed(self, request: Any) -> dict[str, np.ndarray]:
        feed = {}
        for name, reshape in self._inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                continue  # an optional input left out; ORT reports it if the model needs it
            array = tensor.as_numpy()
            if reshape is not None:
                lead = array.shape[:1] if self._batched else ()
                array = array.reshape(tuple(lead) + tuple(int(d) for d in reshape))
            feed[name] = array
        return feed

    def _run_group(self, members: list[tuple[int, dict[str, np.ndarray]]], responses: list[Any]) -> None:
        if len(members) == 1:
            index, feed = members[0]
            responses[index] = self._respond(feed)
            return
        sizes = [next(iter(feed.values())).shape[0] if feed else 0 for _, feed in members]
        names = members[0][1].keys()
        batch = {name: np.concatenate([feed[name] for _, feed in members]) for name in names}
        try:
            outputs = self._run(batch)
        except Exception:
            # One bad request must not fail its batch neighbours: run each on its own.
            for index, feed in members:
                responses[index] = self._respond(feed)
            return
        start = 0
        for (index, _), size in zip(members, sizes, strict=True):
            try:
                responses[index] = self._response([out[start : start + size] for out in outputs])
            except Exception as exc:
                responses[index] = _error_response(exc)
            start += size

    def _respond(self, feed: dict[str, np.ndarray]) -> Any:
        try:
            return self._response(self._run(feed))
        except Exception as exc:
            return _error_response(exc)

    def _response(self, outputs: list[np.ndarray]) -> Any:
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(out)) for name, out in zip(self._outputs, outputs, strict=True)]
        return pb_utils.InferenceResponse(output_tensors=tensors)


def _session(path: Path, options: Any, providers: list[tuple[str, dict[str, str]]]) -> Any:
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


def _error_response(exc: Exception) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"onnxruntime: {exc}"))
