"""Model-config semantics of the ``onnxruntime`` backend, as Triton's C++ onnxruntime backend reads them.

* ``optimization { graph { level } }``: unset/0 → ORT_ENABLE_ALL, -1 → ORT_ENABLE_BASIC,
  1 → ORT_ENABLE_EXTENDED, 2 → ORT_DISABLE_ALL (onnxruntime_backend ``src/onnxruntime.cc``);
* ``parameters``: ``intra_op_thread_count``, ``inter_op_thread_count``, ``execution_mode`` (0 sequential,
  1 parallel), ``enable_mem_arena``, ``enable_mem_pattern``, each a ``string_value``;
* the configured inputs and outputs against the ONNX file's, checked at load.

Part of the backend folder (see ``model.py``): runs in the stub and imports nothing from ``pipeline``.
"""

from __future__ import annotations

import os
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


NUMPY_TYPES = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
}
# Ops whose CUDA kernels rebuild a cuDNN frontend plan on every input-shape change.


def string_parameter(config: dict[str, Any], key: str) -> str | None:
    value = config.get("parameters", {}).get(key)
    return None if value is None else str(value.get("string_value", ""))


def _int_parameter(config: dict[str, Any], key: str, allowed: tuple[int, ...] | None = None) -> int | None:
    text = string_parameter(config, key)
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
    text = string_parameter(config, key)
    if text is None:
        return None
    if text.lower() in ("1", "true", "on", "yes"):
        return True
    if text.lower() in ("0", "false", "off", "no"):
        return False
    raise pb_utils.TritonModelException(f"parameter '{key}' must be a boolean string (1/0, true/false), got '{text}'")


class BackendConfigError(ValueError):
    """A model config this backend cannot serve as asked (raised as TritonModelException at load)."""



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


def op_libraries(config: dict[str, Any], model_dir: str) -> list[str]:
    """The custom-op libraries of ``model_operations { op_library_filename }``: an absolute name as it is, a relative one
    from the repository's root. The C++ backend hands the name to dlopen, which reads a relative one from the server's
    working directory; the pipeline's deploy bundles start the server in the repository's folder, so both agree."""
    names = config.get("model_operations", {}).get("op_library_filename", [])
    root = os.path.dirname(os.path.normpath(model_dir))
    return [name if os.path.isabs(name) else os.path.join(root, name) for name in names]


def check_io(kind: str, configured: list[dict[str, Any]], actual: list[Any], batched: bool) -> None:
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

