"""A Python-based Triton backend named ``onnxruntime`` that serves ONNX models with ONNX Runtime (CPU or GPU).

Production Triton serves ``platform: "onnxruntime_onnx"`` models with its C++ ONNX Runtime backend; the
embedded ``tritonserver`` from the nvidia-pytriton wheel ships only the Python backend. Triton resolves
that platform to the backend name ``onnxruntime`` and, finding ``<backend-directory>/onnxruntime/model.py``
instead of ``libtriton_onnxruntime.so``, runs this file in a Python backend stub. So the same repository
loads unchanged here and in production.

This file is the glue (:class:`TritonPythonModel`); each job has its module beside it in this folder:

* ``ort_backend_config.py``: the model config as the C++ backend reads it (graph level, threads, I/O check);
* ``ort_backend_providers.py``: execution providers per instance kind, sessions, the shared CUDA arena;
* ``ort_backend_batching.py``: fixed batch sizes and the runner that pads to them;
* ``ort_backend_transport.py``: tensors in and out (numpy views on CPU, IO binding and DLPack on a GPU).

The folder is copied whole into the server's backend directory (``TritonServer._prepare_backends``), and
the stub appends this file's folder to ``sys.path`` before importing it (python_backend
``src/pb_stub.cc``, ``Stub::Initialize``), so the siblings import as top-level modules; their
``ort_backend_`` prefix keeps them from shadowing or being shadowed by installed packages.

Requests of one dynamic batch whose inputs have equal per-sample shapes run as one ONNX Runtime call
and are split back. A failing request gets its own error response; it never takes the stub down.

These files run inside the stub, in the project's venv, and import nothing from the ``pipeline`` package.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from ort_backend_batching import SessionRunner, fixed_batch_sizes, plan_per_shape, warmup_feed
from ort_backend_config import BackendConfigError, check_io, graph_level_name, op_libraries, session_options_from_config
from ort_backend_providers import execution_providers, open_session, shared_arena, tensorrt_loadable
from ort_backend_transport import device_io, host_feed, on_device, output_tensors, request_tensors, run_on_device


class TritonPythonModel:
    """One model instance: ONNX Runtime session(s) for the model file, fed by Triton's batches."""

    def initialize(self, args: dict[str, str]) -> None:
        import onnxruntime as ort

        config = json.loads(args["model_config"])
        filename = config.get("default_model_filename") or "model.onnx"
        # Resolved: the server may see the model through a symlinked view; messages name the real file.
        path = (Path(args["model_repository"]) / args["model_version"] / filename).resolve()
        options = session_options_from_config(config)
        libraries = op_libraries(config, args["model_repository"])
        for library in libraries:
            options.register_custom_ops_library(library)
        kind = args.get("model_instance_kind", "CPU")
        self._device_id = int(args.get("model_instance_device_id", 0))
        try:
            providers, notes = execution_providers(
                config, kind, self._device_id, ort.get_available_providers(), kind == "GPU" and tensorrt_loadable(),
            )
        except BackendConfigError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None
        for note in notes:
            pb_utils.Logger.log_warn(f"onnxruntime (python) {path}: {note}")
        self._batched = int(config.get("max_batch_size", 0)) > 0
        try:
            sizes = fixed_batch_sizes(config, providers, self._batched and plan_per_shape(path))
        except BackendConfigError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None
        shared = bool(sizes) and shared_arena(providers)
        if shared:
            options.add_session_config_entry("session.use_env_allocators", "1")
        try:
            session = open_session(path, options, providers)
        except pb_utils.TritonModelException as exc:
            if not shared:
                raise
            # Without the shared arena: more memory, same results (a real load error fails again, as itself).
            pb_utils.Logger.log_warn(f"onnxruntime (python) {path}: sessions keep their own arenas ({exc})")
            options = session_options_from_config(config)
            for library in libraries:
                options.register_custom_ops_library(library)
            session = open_session(path, options, providers)
        check_io("input", config.get("input", []), session.get_inputs(), self._batched)
        check_io("output", config.get("output", []), session.get_outputs(), self._batched)
        self._inputs = [(entry["name"], entry.get("reshape", {}).get("shape")) for entry in config.get("input", [])]
        self._outputs = [entry["name"] for entry in config.get("output", [])]
        sessions = self._fixed_size_sessions(config, path, options, providers, session, sizes) if sizes else {}
        self._runner = SessionRunner(session, self._outputs, sessions, sizes)
        self._device = device_io(kind, session.get_providers(), hasattr(ort.OrtValue, "from_dlpack"))
        pb_utils.Logger.log_info(
            f"onnxruntime (python) loaded {path}: graph_optimization_level={graph_level_name(config)} "
            f"intra_op_threads={options.intra_op_num_threads or 'default'} "
            f"inter_op_threads={options.inter_op_num_threads or 'default'} batched={self._batched} "
            f"kind={kind} providers={','.join(session.get_providers())} "
            f"fixed_batch_sizes={','.join(map(str, sizes)) or 'off'} tensors={'device' if self._device else 'host'} "
            f"onnxruntime={ort.__version__} python={sys.version.split()[0]} prefix={sys.prefix}"
        )

    @staticmethod
    def _fixed_size_sessions(
        config: dict[str, Any], path: Path, options: Any, providers: list[tuple[str, dict[str, str]]], session: Any, sizes: list[int]
    ) -> dict[int, Any]:
        """One session per fixed batch size (the largest is the instance's own), each run once at its
        size now, so each Conv builds its one plan at load rather than under the first requests."""
        sessions = {sizes[-1]: session}
        for size in sizes[:-1]:
            sessions[size] = open_session(path, options, providers)
        outputs = [entry["name"] for entry in config.get("output", [])] or None
        for size, each in sessions.items():
            feed = warmup_feed(config, size)
            try:
                if feed is not None:
                    each.run(outputs, feed)
            except Exception as exc:
                raise pb_utils.TritonModelException(f"ONNX Runtime cannot run {path} at batch size {size}: {exc}") from None
        return sessions

    def execute(self, requests: list[Any]) -> list[Any]:
        """Run each group of shape-compatible requests as one ONNX Runtime call; errors stay per request."""
        if self._device and len(requests) == 1:
            response = self._on_device(requests[0])
            if response is not None:
                return [response]
        responses: list[Any] = [None] * len(requests)
        groups: dict[tuple[Any, ...], list[tuple[int, dict[str, np.ndarray]]]] = {}
        for index, request in enumerate(requests):
            try:
                feed = host_feed(request_tensors(request, self._inputs), self._inputs, self._batched)
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
        self._runner = None

    def _on_device(self, request: Any) -> Any | None:
        """The response of a request run with its tensors on the GPU, or None when it must go through the host."""
        try:
            tensors = request_tensors(request, self._inputs)
            rows = int(next(iter(tensors.values())).shape()[0]) if tensors and self._batched else 0
            session, size = self._runner.plan(rows) if self._batched else (self._runner.session, 0)
            if not on_device(1, rows, size):
                return None
            outputs = run_on_device(session, tensors, self._inputs, self._outputs, self._device_id, self._batched)
            return pb_utils.InferenceResponse(output_tensors=output_tensors(self._outputs, outputs))
        except Exception as exc:
            return _error_response(exc)

    def _run_group(self, members: list[tuple[int, dict[str, np.ndarray]]], responses: list[Any]) -> None:
        if len(members) == 1:
            index, feed = members[0]
            responses[index] = self._respond(feed)
            return
        sizes = [next(iter(feed.values())).shape[0] if feed else 0 for _, feed in members]
        names = members[0][1].keys()
        batch = {name: np.concatenate([feed[name] for _, feed in members]) for name in names}
        try:
            outputs = self._runner.run(batch)
        except Exception:
            # One bad request must not fail its batch neighbours: run each on its own.
            for index, feed in members:
                responses[index] = self._respond(feed)
            return
        start = 0
        for (index, _), size in zip(members, sizes, strict=True):
            try:
                tensors = output_tensors(self._outputs, [out[start : start + size] for out in outputs])
                responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
            except Exception as exc:
                responses[index] = _error_response(exc)
            start += size

    def _respond(self, feed: dict[str, np.ndarray]) -> Any:
        try:
            return pb_utils.InferenceResponse(output_tensors=output_tensors(self._outputs, self._runner.run(feed)))
        except Exception as exc:
            return _error_response(exc)


def _error_response(exc: Exception) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"onnxruntime: {exc}"))
