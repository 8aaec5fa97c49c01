"""Fixtures for serving tests: tiny real ONNX models and Triton repositories written as ModelConfig protobufs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.triton.server import TritonServer

SOFTMAX_WEIGHTS = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5.0) / 4.0
EMBEDDING_TABLE = np.arange(20, dtype=np.float32).reshape(10, 2) * 0.5


def softmax_onnx(path: Path) -> Path:
    """x float32 [batch,4] → MatMul → Softmax → probs float32 [batch,3]."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)],
        "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(SOFTMAX_WEIGHTS, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def gather_onnx(path: Path) -> Path:
    """ids int64 [batch,3] → Gather rows of a [10,2] table → emb float32 [batch,3,2] (index ≥ 10 fails)."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0)],
        "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["batch", 3, 2])],
        [numpy_helper.from_array(EMBEDDING_TABLE, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def model_config(
    name: str, inputs: list[tuple[str, int, list[int]]], outputs: list[tuple[str, int, list[int]]], *,
    platform: str = "onnxruntime_onnx", max_batch_size: int = 8, queue_delay_us: int | None = None,
    graph_level: int | None = None, parameters: dict[str, str] | None = None,
) -> mc.ModelConfig:
    """A ModelConfig protobuf for one model (CPU instance, optional dynamic batching)."""
    config = mc.ModelConfig(name=name, platform=platform, max_batch_size=max_batch_size)
    for tensor_name, dtype, dims in inputs:
        config.input.add(name=tensor_name, data_type=dtype, dims=dims)
    for tensor_name, dtype, dims in outputs:
        config.output.add(name=tensor_name, data_type=dtype, dims=dims)
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    if queue_delay_us is not None:
        config.dynamic_batching.max_queue_delay_microseconds = queue_delay_us
    if graph_level is not None:
        config.optimization.graph.level = graph_level
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = value
    return config


def write_model(repo: Path, config: mc.ModelConfig, model_bytes: bytes, filename: str = "model.onnx") -> Path:
    """Write ``<repo>/<name>/1/<filename>`` first, then ``config.pbtxt`` (text_format of the protobuf)."""
    model_dir = repo / config.name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / filename).write_bytes(model_bytes)
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
    return model_dir


def softmax_config(name: str, **kwargs: object) -> mc.ModelConfig:
    return model_config(name, [("x", mc.TYPE_FP32, [4])], [("probs", mc.TYPE_FP32, [3])], **kwargs)  # type: ignore[arg-type]


def gather_config(name: str, **kwargs: object) -> mc.ModelConfig:
    return model_config(name, [("ids", mc.TYPE_INT64, [3])], [("emb", mc.TYPE_FP32, [3, 2])], **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def onnx_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny ONNX files: ``softmax`` (float input) and ``gather`` (int64 input)."""
    root = tmp_path_factory.mktemp("onnx")
    return {"softmax": softmax_onnx(root / "softmax.onnx"), "gather": gather_onnx(root / "gather.onnx")}


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory, onnx_models: dict[str, Path]) -> Path:
    """A repository as production would serve it, including a TensorRT plan this CPU server must skip.

    ``tiny``: softmax, dynamic batching (1 s window: concurrent requests meet even on a loaded machine), default graph level.
    ``tiny_noopt``: same file, ``graph.level: 2`` (ORT_DISABLE_ALL) and ``intra_op_thread_count: 1``.
    ``ids``: int64 input, dynamic batching, ``graph.level: -1`` (ORT_ENABLE_BASIC).
    ``tiny_fixed``: softmax run at fixed batch sizes 2, 5 and 8 (``fixed_batch_sizes``).
    ``tiny_fp32_trt``: platform tensorrt_plan; the plan bytes are fake — it must never be loaded here.
    """
    repo = tmp_path_factory.mktemp("model_repository")
    softmax, gather = onnx_models["softmax"].read_bytes(), onnx_models["gather"].read_bytes()
    write_model(repo, softmax_config("tiny", queue_delay_us=1_000_000), softmax)
    write_model(repo, softmax_config("tiny_noopt", graph_level=2, parameters={"intra_op_thread_count": "1"}), softmax)
    write_model(repo, gather_config("ids", queue_delay_us=50_000, graph_level=-1), gather)
    write_model(repo, softmax_config("tiny_fixed", queue_delay_us=200_000, parameters={"fixed_batch_sizes": "2,5"}), softmax)
    plan = softmax_config("tiny_fp32_trt", platform="tensorrt_plan")
    plan.instance_group[0].kind = mc.ModelInstanceGroup.KIND_GPU
    write_model(repo, plan, b"not a real TensorRT engine", filename="model.plan")
    return repo


def shm_entries(owner: int | None = None) -> set[str]:
    """/dev/shm segments of servers started by process ``owner`` (default: this one).

    Filtered by owner because other processes on the machine may run Triton servers meanwhile.
    """
    prefix = f"pipeline_triton_{owner or os.getpid()}_"
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}


def child_pids(parent: int | None = None) -> set[int]:
    """PIDs whose parent is ``parent`` (default: this test process, so a leaked tritonserver shows)."""
    me, pids = parent or os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                pids.add(int(entry))
    return pids


@pytest.fixture(scope="session")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """One real tritonserver on free loopback ports, shared by the serving tests."""
    log_path = tmp_path_factory.mktemp("logs") / "tritonserver.log"
    with TritonServer(repository, log_path=log_path) as running:
        yield running
