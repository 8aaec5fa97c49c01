"""Fixtures for load-test tests: a real embedded tritonserver on a tiny repository.

``add`` is an ONNX model (x float32 [batch,4] → y = x + 1) served by the project's ONNX Runtime
backend; ``sleepy`` is a Python-backend model that sleeps SLEEP_S per execution (capacity
1 / SLEEP_S requests/s, no batching), so overload is certain and independent of machine speed.
Nothing is mocked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import model_config_pb2 as mc

SLEEP_S = 0.02

SLEEPY_MODEL_PY = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({sleep})
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
            for r in requests
        ]
'''


def add_one_onnx() -> bytes:
    """x float32 [batch,4] → Add 1 → y float32 [batch,4]."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "add_one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.ones(4, dtype=np.float32), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def io_config(name: str, *, platform: str = "", backend: str = "", max_batch_size: int = 8) -> mc.ModelConfig:
    """x/y float32 [4] per sample, one CPU instance."""
    config = mc.ModelConfig(name=name, platform=platform, backend=backend, max_batch_size=max_batch_size)
    config.input.add(name="x", data_type=mc.TYPE_FP32, dims=[4])
    config.output.add(name="y", data_type=mc.TYPE_FP32, dims=[4])
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    return config


def write_model(repo: Path, config: mc.ModelConfig, filename: str, content: bytes) -> None:
    """Model file first, then config.pbtxt (text_format of the protobuf)."""
    (repo / config.name / "1").mkdir(parents=True, exist_ok=True)
    (repo / config.name / "1" / filename).write_bytes(content)
    (repo / config.name / "config.pbtxt").write_text(text_format.MessageToString(config))


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``model_repository/`` with ``add`` and ``sleepy``, and ``calibration/add/eval.npz``."""
    root = tmp_path_factory.mktemp("loadtest")
    repo = root / "model_repository"
    write_model(repo, io_config("add", platform="onnxruntime_onnx"), "model.onnx", add_one_onnx())
    write_model(repo, io_config("sleepy", backend="python"), "model.py",
                SLEEPY_MODEL_PY.format(sleep=SLEEP_S).encode())  # fmt: skip
    rng = np.random.default_rng(0)
    samples = rng.random((64, 4), dtype=np.float32)
    (root / "calibration" / "add").mkdir(parents=True)
    np.savez(root / "calibration" / "add" / "eval.npz", x=samples, labels=np.zeros(64, dtype=np.int64))
    (root / "calibration" / "sleepy").mkdir(parents=True)
    np.savez(root / "calibration" / "sleepy" / "eval.npz", x=samples)
    return root


@pytest.fixture(scope="session")
def _servers() -> Iterator[list[object]]:
    """Every embedded server the session started (normally one), stopped at the end."""
    started: list[object] = []
    yield started
    for running in started:
        running.stop()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def server(workspace: Path, _servers: list[object]) -> object:
    """The embedded tritonserver on the test repository, shared by the session's modules.

    Triton 2.51's Python backend can abort the whole server under concurrent load
    (``boost::interprocess::lock_exception`` in ``TRITONBACKEND_ModelInstanceExecute``: once here, in the
    third of three shuffled suite runs on 2026-12-01, under the shard rehearsal's four client processes;
    triton-inference-server/server#8882). A module that finds the server dead starts a new one, so such
    a crash fails the module it happened in, not every later one; the dead server's log stays in the
    workspace with the crash's stack."""
    from pipeline.triton.server import TritonServer

    if _servers and _servers[-1].is_running():  # type: ignore[attr-defined]
        return _servers[-1]
    if _servers:
        _servers[-1].stop()  # type: ignore[attr-defined]  # its orphaned stubs and segments
    log = workspace / f"tritonserver-{len(_servers)}.log"
    running = TritonServer(workspace / "model_repository", log_path=log)
    running.start()
    _servers.append(running)
    return running
