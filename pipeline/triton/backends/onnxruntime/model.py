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
  1 parallel), ``enable_mem_arena``, ``enable_mem_pattern``, each a ``string_value``.

Requests of one dynamic batch whose inputs have equal per-sample shapes run as one ONNX Runtime call
and are split back. A failing request gets its own error response; it never takes the stub down.

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
        try:
            self._session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises several types; the load must fail with the cause
            raise pb_utils.TritonModelException(f"ONNX Runtime cannot load {path}: {exc}") from None
        self._batched = int(config.get("max_batch_size", 0)) > 0
        _check_io("input", config.get("input", []), self._session.get_inputs(), self._batched)
        _check_io("output", config.get("output", []), self._session.get_outputs(), self._batched)
        self._inputs = [(entry["name"], entry.get("reshape", {}).get("shape")) for entry in config.get("input", [])]
        self._outputs = [entry["name"] for entry in config.get("output", [])]
        pb_utils.Logger.log_info(
            f"onnxruntime (python) loaded {path}: graph_optimization_level={graph_level_name(config)} "
            f"intra_op_threads={options.intra_op_num_threads or 'default'} "
            f"inter_op_threads={options.inter_op_num_threads or 'default'} batched={self._batched} "
            f"onnxruntime={ort.__version__} python={sys.version.split()[0]} prefix={sys.prefix}"
        )

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
            outputs = self._session.run(self._outputs, batch)
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
            return self._response(self._session.run(self._outputs, feed))
        except Exception as exc:
            return _error_response(exc)

    def _response(self, outputs: list[np.ndarray]) -> Any:
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(out)) for name, out in zip(self._outputs, outputs, strict=True)]
        return pb_utils.InferenceResponse(output_tensors=tensors)


def _error_response(exc: Exception) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"onnxruntime: {exc}"))
