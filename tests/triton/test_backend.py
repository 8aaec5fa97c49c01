"""The Python-based ``onnxruntime`` backend: config semantics, int64 inputs, dynamic batching, per-request errors."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.core.errors import PipelineError
from pipeline.triton.config import ORT_LEVEL_BY_GRAPH_LEVEL
from pipeline.triton.server import OUR_BACKENDS, TritonServer
from tests.triton.conftest import EMBEDDING_TABLE, SOFTMAX_WEIGHTS, child_pids, softmax_config, write_model


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback never via a proxy


BACKEND_MODULES = ("ort_backend_config", "ort_backend_providers", "ort_backend_batching", "ort_backend_transport", "model")


@pytest.fixture(scope="module")
def backend() -> SimpleNamespace:
    """The backend folder's modules, imported as the stub imports them (the folder on ``sys.path``) with
    the real triton_python_backend_utils shipped in the wheel; their public names in one namespace.

    Outside the stub that module lacks the C++-injected classes (TritonError, Logger, ...), so only the
    pure configuration helpers are exercised here; the rest is tested through the real server.
    """
    import pytriton

    folder = OUR_BACKENDS / "onnxruntime"
    paths = [str(Path(pytriton.__file__).parent / "tritonserver" / "backends" / "python"), str(folder)]
    sys.path[:0] = paths
    names: dict[str, object] = {}
    try:
        for name in BACKEND_MODULES:
            spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            names.update({k: v for k, v in vars(module).items() if not k.startswith("_")})
    finally:
        del sys.path[: len(paths)]
        for name in BACKEND_MODULES:
            sys.modules.pop(name, None)
    return SimpleNamespace(**names)


@pytest.mark.parametrize(("level", "expected"), [(None, "ORT_ENABLE_ALL"), *ORT_LEVEL_BY_GRAPH_LEVEL.items()])
def test_graph_level_follows_the_cpp_onnxruntime_backend(backend: SimpleNamespace, level: int | None, expected: str) -> None:
    config: dict = {} if level is None else {"optimization": {"graph": {"level": level}}}
    options = backend.session_options_from_config(config)
    assert options.graph_optimization_level == getattr(ort.GraphOptimizationLevel, expected)


def test_the_backend_maps_graph_levels_as_the_config_module_does(backend: SimpleNamespace) -> None:
    """The backend keeps its own copy on purpose: it is copied into every model repository and runs in Triton's
    Python stub, so it imports nothing from ``pipeline``; this test keeps the copy equal to the one home."""
    assert backend.GRAPH_LEVELS == ORT_LEVEL_BY_GRAPH_LEVEL


def test_thread_and_memory_parameters_reach_the_session_options(backend: SimpleNamespace) -> None:
    config = {"parameters": {
        "intra_op_thread_count": {"string_value": "3"},
        "inter_op_thread_count": {"string_value": "2"},
        "execution_mode": {"string_value": "1"},
        "enable_mem_arena": {"string_value": "0"},
    }}
    options = backend.session_options_from_config(config)
    assert options.intra_op_num_threads == 3
    assert options.inter_op_num_threads == 2
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.enable_cpu_mem_arena is False


GPU_ORT = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]  # what onnxruntime-gpu lists
ACCELERATED = {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [
    {"name": "tensorrt", "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824",
                                        "trt_engine_cache_enable": "1", "trt_engine_cache_path": "/tmp/c"}},
    {"name": "cuda", "parameters": {"use_tf32": "0"}},
]}}}


def test_cpu_instances_ignore_the_gpu_accelerators(backend: SimpleNamespace) -> None:
    assert backend.execution_providers(ACCELERATED, "CPU", 0, ort.get_available_providers(), False) == ([("CPUExecutionProvider", {})], [])


def test_gpu_instance_without_onnxruntime_gpu_names_the_extra(backend: SimpleNamespace) -> None:
    """This venv's real ONNX Runtime is the CPU build: a GPU instance must say which extra to install."""
    with pytest.raises(backend.BackendConfigError, match=r"install the 'gpu-serve' extra \(onnxruntime-gpu"):
        backend.execution_providers(ACCELERATED, "GPU", 0, ort.get_available_providers(), False)


def test_gpu_instance_runs_tensorrt_then_cuda_as_the_cpp_backend_appends_them(backend: SimpleNamespace) -> None:
    """The provider lists are as onnxruntime-gpu would get them (no GPU here: checked as data)."""
    providers, notes = backend.execution_providers(ACCELERATED, "GPU", 1, GPU_ORT, True)
    assert providers == [
        ("TensorrtExecutionProvider", {"trt_fp16_enable": "1", "trt_max_workspace_size": "1073741824", "trt_engine_cache_enable": "1",
                                       "trt_engine_cache_path": "/tmp/c", "device_id": "1"}),
        ("CUDAExecutionProvider", {"use_tf32": "0", "device_id": "1"}),
    ] and notes == []


def test_without_tensorrt_libraries_the_cuda_provider_runs_alone_and_says_so(backend: SimpleNamespace) -> None:
    """The decision for a machine without TensorRT's libraries (whether this one has them is not the question)."""
    assert isinstance(backend.tensorrt_loadable(), bool)
    providers, notes = backend.execution_providers(ACCELERATED, "GPU", 0, GPU_ORT, False)
    assert providers == [("CUDAExecutionProvider", {"use_tf32": "0", "device_id": "0"})]
    assert notes and "TensorRT" in notes[0] and "CUDA execution provider alone" in notes[0]


def test_deprecated_cuda_parameters_get_the_cpp_backends_defaults(backend: SimpleNamespace) -> None:
    config = {"parameters": {"cudnn_conv_algo_search": {"string_value": "1"}, "intra_op_thread_count": {"string_value": "2"}}}
    [(name, options)], _ = backend.execution_providers(config, "GPU", 0, ["CUDAExecutionProvider", "CPUExecutionProvider"], False)
    assert name == "CUDAExecutionProvider"
    assert options == {"cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": str(2**64 - 1), "arena_extend_strategy": "kNextPowerOfTwo",
                       "do_copy_in_default_stream": "1", "device_id": "0"}


@pytest.mark.parametrize(
    ("accelerator", "message"),
    [({"name": "openvino"}, "unknown Execution Accelerator 'openvino'"),
     ({"name": "tensorrt", "parameters": {"precision_mode": "BF16"}}, "unsupported precision mode 'BF16'"),
     ({"name": "tensorrt", "parameters": {"workspace": "1"}}, "unknown parameter 'workspace' is provided for TensorRT")],
)
def test_accelerators_the_cpp_backend_refuses_fail_the_load(backend: SimpleNamespace, accelerator: dict, message: str) -> None:
    config = {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [accelerator]}}}
    with pytest.raises(backend.BackendConfigError, match=message):
        backend.execution_providers(config, "GPU", 0, GPU_ORT, True)


CUDA_ONLY = [("CUDAExecutionProvider", {"device_id": "0"})]
WITH_TRT = [("TensorrtExecutionProvider", {"device_id": "0"}), *CUDA_ONLY]


def batched(max_batch: int, preferred: list[int] | None = None, fixed: str | None = None) -> dict:
    config: dict = {"max_batch_size": max_batch, "dynamic_batching": {"preferred_batch_size": preferred or []}}
    if fixed is not None:
        config["parameters"] = {"fixed_batch_sizes": {"string_value": fixed}}
    return config


def test_a_cnn_on_the_cuda_provider_runs_at_fixed_batch_sizes(backend: SimpleNamespace) -> None:
    """Powers of two below the max, the preferred sizes and the max: each Conv then sees few shapes."""
    assert backend.fixed_batch_sizes(batched(128, [48, 128]), CUDA_ONLY, True) == [1, 2, 4, 8, 16, 32, 48, 64, 128]
    assert backend.fixed_batch_sizes(batched(100), CUDA_ONLY, True) == [1, 2, 4, 8, 16, 32, 64, 100]


@pytest.mark.parametrize(
    ("config", "providers", "conv", "why"),
    [(batched(64), WITH_TRT, True, "TensorRT's profile covers 1..max"),
     (batched(64), [("CPUExecutionProvider", {})], True, "the CPU provider keeps no per-shape plan"),
     (batched(64), CUDA_ONLY, False, "no Conv"),
     (batched(1), CUDA_ONLY, True, "nothing to batch"),
     (batched(64, fixed="off"), CUDA_ONLY, True, "switched off")],
)
def test_fixed_batch_sizes_only_where_plans_are_rebuilt(backend: SimpleNamespace, config: dict, providers: list, conv: bool, why: str) -> None:
    assert backend.fixed_batch_sizes(config, providers, conv) == [], why


def test_listed_fixed_batch_sizes_always_include_the_max(backend: SimpleNamespace) -> None:
    assert backend.fixed_batch_sizes(batched(8, fixed="2, 5"), [("CPUExecutionProvider", {})], False) == [2, 5, 8]
    with pytest.raises(backend.BackendConfigError, match=r"sizes must lie in 1\.\.8"):
        backend.fixed_batch_sizes(batched(8, fixed="4,16"), CUDA_ONLY, True)
    with pytest.raises(backend.BackendConfigError, match="'auto', 'off' or batch sizes"):
        backend.fixed_batch_sizes(batched(8, fixed="small"), CUDA_ONLY, True)


def test_a_batch_is_padded_to_its_fixed_size_with_its_own_last_row(backend: SimpleNamespace) -> None:
    assert [backend.size_for(n, [1, 4, 16]) for n in (1, 2, 4, 5, 16)] == [1, 4, 4, 16, 16]
    assert backend.size_for(3, []) == 3
    feed = {"x": np.arange(6, dtype=np.float32).reshape(3, 2), "ids": np.array([[1], [2], [3]])}
    grown = backend.padded(feed, 5)
    np.testing.assert_array_equal(grown["x"], [[0, 1], [2, 3], [4, 5], [4, 5], [4, 5]])
    np.testing.assert_array_equal(grown["ids"], [[1], [2], [3], [3], [3]])
    assert backend.padded(feed, 3)["x"] is feed["x"]


def test_models_with_convolutions_are_recognised(backend: SimpleNamespace, tmp_path: Path, onnx_models: dict[str, Path]) -> None:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1, 2, 2])],
        [numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "w")],
    )
    import onnx

    onnx.save(helper.make_model(graph), str(tmp_path / "conv.onnx"))
    assert backend.plan_per_shape(tmp_path / "conv.onnx") is True
    assert backend.plan_per_shape(onnx_models["softmax"]) is False


def test_only_gpu_instances_on_a_gpu_provider_bind_tensors_on_the_device(backend: SimpleNamespace) -> None:
    assert backend.device_io("GPU", ["CUDAExecutionProvider", "CPUExecutionProvider"], dlpack=True)
    assert backend.device_io("GPU", ["TensorrtExecutionProvider", "CUDAExecutionProvider"], dlpack=True)
    assert not backend.device_io("CPU", ["CUDAExecutionProvider", "CPUExecutionProvider"], dlpack=True)
    assert not backend.device_io("GPU", ["CPUExecutionProvider"], dlpack=True)
    assert not backend.device_io("GPU", ["CUDAExecutionProvider"], dlpack=False)  # an ORT without OrtValue.from_dlpack


def test_a_group_stays_on_the_device_only_as_one_unpadded_request(backend: SimpleNamespace) -> None:
    assert backend.on_device(1, 128, 128)
    assert not backend.on_device(1, 100, 128)  # padding to the fixed size needs device arithmetic
    assert not backend.on_device(2, 64, 64)  # so does merging two requests


def test_host_inputs_are_views_of_the_request_memory(backend: SimpleNamespace) -> None:
    """A CPU instance hands ONNX Runtime the stub's memory itself: the feed (reshaped as configured)
    shares memory with the request's array."""

    class CpuTensor:  # stand-in for pb_utils.Tensor, whose C++ class exists only inside the stub
        def __init__(self, array: np.ndarray) -> None:
            self.array = array

        def is_cpu(self) -> bool:
            return True

        def as_numpy(self) -> np.ndarray:
            return self.array

    array = np.random.default_rng(0).random((4, 64), dtype=np.float32)
    feed = backend.host_feed({"image": CpuTensor(array)}, [("image", [8, 8, 1]), ("absent", None)], True)
    assert feed["image"].shape == (4, 8, 8, 1) and np.shares_memory(feed["image"], array)
    assert "absent" not in feed


def test_warmup_feed_follows_the_config_and_skips_variable_dims(backend: SimpleNamespace) -> None:
    config = {"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["4"]},
                        {"name": "ids", "data_type": "TYPE_INT64", "dims": ["6"], "reshape": {"shape": ["2", "3"]}}]}
    feed = backend.warmup_feed(config, 5)
    assert feed["x"].shape == (5, 4) and feed["x"].dtype == np.float32
    assert feed["ids"].shape == (5, 2, 3) and feed["ids"].dtype == np.int64
    assert backend.warmup_feed({"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["-1"]}]}, 2) is None


def loaded_lines(server: TritonServer) -> dict[str, str]:
    """The backend's one 'loaded' log line per model, keyed by model name."""
    assert server.log_path is not None
    lines = {}
    for line in server.log_path.read_text().splitlines():
        match = re.search(r"onnxruntime \(python\) loaded .*/([^/]+)/1/model\.onnx: (.*)\"$", line)
        if match:
            lines[match.group(1)] = match.group(2)
    return lines


@pytest.mark.slow
def test_served_models_get_the_configured_session_options_in_this_venv(server: TritonServer) -> None:
    lines = loaded_lines(server)
    assert "graph_optimization_level=ORT_ENABLE_ALL " in lines["tiny"]
    assert "graph_optimization_level=ORT_DISABLE_ALL intra_op_threads=1 " in lines["tiny_noopt"]
    assert "graph_optimization_level=ORT_ENABLE_BASIC " in lines["ids"]
    assert "fixed_batch_sizes=off " in lines["tiny"]  # a CPU instance as the batch comes
    assert "fixed_batch_sizes=2,5,8 " in lines["tiny_fixed"]
    for line in lines.values():  # the stub runs this interpreter's Python with this venv's packages
        assert f"onnxruntime={ort.__version__} python={sys.version.split()[0]} prefix={sys.prefix}" in line


@pytest.mark.slow
def test_int64_input_round_trip(server: TritonServer) -> None:
    import tritonclient.http as httpclient

    ids = np.array([[0, 9, 3], [5, 5, 1]], dtype=np.int64)
    inp = httpclient.InferInput("ids", list(ids.shape), "INT64")
    inp.set_data_from_numpy(ids)
    with closing(httpclient.InferenceServerClient(server.http_url)) as client:
        np.testing.assert_array_equal(client.infer("ids", [inp]).as_numpy("emb"), EMBEDDING_TABLE[ids])


def model_stats(server: TritonServer, model: str) -> dict:
    with _DIRECT.open(f"http://{server.http_url}/v2/models/{model}/stats", timeout=10) as response:
        return json.load(response)["model_stats"][0]


def infer_concurrently(server: TritonServer, model: str, inputs: list[np.ndarray]) -> None:
    """Send every ``x`` of ``inputs`` to the softmax ``model`` at once; each answer must be softmax(x @ W)."""
    import tritonclient.http as httpclient

    def infer(x: np.ndarray) -> np.ndarray:
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        with closing(httpclient.InferenceServerClient(server.http_url)) as client:
            return client.infer(model, [inp]).as_numpy("probs")

    with ThreadPoolExecutor(max_workers=len(inputs)) as pool:
        results = list(pool.map(infer, inputs))
    for x, probs in zip(inputs, results, strict=True):
        logits = x @ SOFTMAX_WEIGHTS
        expected = np.exp(logits - logits.max(axis=1, keepdims=True))
        np.testing.assert_allclose(probs, expected / expected.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_concurrent_requests_are_batched_and_split_back(server: TritonServer) -> None:
    before = model_stats(server, "tiny")
    inputs = [np.random.default_rng(i).normal(size=(1 + i % 3, 4)).astype(np.float32) for i in range(12)]
    infer_concurrently(server, "tiny", inputs)
    samples = sum(len(x) for x in inputs)
    deadline = time.monotonic() + 10
    while True:  # Triton records statistics just after it sends the responses
        after = model_stats(server, "tiny")
        if after["inference_count"] - before["inference_count"] >= samples or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert after["inference_count"] - before["inference_count"] == samples
    executions = after["execution_count"] - before["execution_count"]
    # Triton's statistics extension: fewer model executions than requests, and executions of batches
    # larger than any single request (3 rows) — the dynamic batcher merged concurrent requests.
    assert executions < len(inputs), "the dynamic batcher should have merged concurrent requests"
    old_counts = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    new_counts = {b["batch_size"]: b["compute_infer"]["count"] - old_counts.get(b["batch_size"], 0) for b in after["batch_stats"]}
    assert sum(size * count for size, count in new_counts.items()) == samples
    assert sum(new_counts.values()) == executions
    assert any(count for size, count in new_counts.items() if size > 3), new_counts


@pytest.mark.slow
def test_a_failing_request_does_not_fail_its_batch_or_the_stub(server: TritonServer) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    batches = [np.array([[1, 2, 3]]), np.array([[4, 42, 0]]), np.array([[7, 8, 9]])]  # 42: past the 10-row table

    def infer(ids: np.ndarray) -> np.ndarray | str:
        inp = httpclient.InferInput("ids", list(ids.shape), "INT64")
        inp.set_data_from_numpy(ids.astype(np.int64))
        with closing(httpclient.InferenceServerClient(server.http_url)) as client:
            try:
                return client.infer("ids", [inp]).as_numpy("emb")
            except InferenceServerException as exc:
                return str(exc)

    with ThreadPoolExecutor(max_workers=3) as pool:
        good1, bad, good2 = pool.map(infer, batches)
    np.testing.assert_array_equal(good1, EMBEDDING_TABLE[batches[0]])
    np.testing.assert_array_equal(good2, EMBEDDING_TABLE[batches[2]])
    assert isinstance(bad, str) and "onnxruntime" in bad and "42" in bad
    np.testing.assert_array_equal(infer(batches[0]), EMBEDDING_TABLE[batches[0]])  # the stub is still up


@pytest.mark.slow
def test_config_that_disagrees_with_the_model_fails_the_load_clearly(tmp_path: Path, onnx_models: dict[str, Path]) -> None:
    repo = tmp_path / "repo"
    wrong = softmax_config("wrong_dtype")
    wrong.input[0].data_type = mc.TYPE_FP16
    write_model(repo, wrong, onnx_models["softmax"].read_bytes())
    before = child_pids()
    with pytest.raises(PipelineError) as error:
        TritonServer(repo, log_path=tmp_path / "t.log").start()
    assert "model 'wrong_dtype' failed to load" in error.value.problem
    assert "config input 'x' is TYPE_FP16 but the ONNX model's is TYPE_FP32" in error.value.problem
    assert child_pids() == before


@pytest.mark.slow
def test_batches_run_at_fixed_sizes_come_back_unpadded(server: TritonServer) -> None:
    """``tiny_fixed`` runs every batch at 2, 5 or 8 rows (``fixed_batch_sizes: "2,5"``, on the CPU here as a
    GPU instance on the CUDA provider would): each response has exactly its request's rows, correct."""
    inputs = [np.random.default_rng(i).normal(size=(1 + i % 3, 4)).astype(np.float32) for i in range(9)]
    infer_concurrently(server, "tiny_fixed", inputs)
    assert model_stats(server, "tiny_fixed")["inference_count"] >= sum(len(x) for x in inputs)  # counted unpadded


def test_both_supported_tensorrt_majors_are_looked_for(backend: SimpleNamespace) -> None:
    from pipeline.backend.tensorrt_env import MAX_TENSORRT, MIN_TENSORRT

    majors = range(MIN_TENSORRT[0], MAX_TENSORRT[0])  # MAX_TENSORRT is exclusive
    assert sorted(backend.NVINFER_LIBRARIES) == sorted(f"libnvinfer.so.{m}" for m in majors)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs the GNU C library's soname")
def test_any_of_the_tensorrt_libraries_loading_is_enough(backend: SimpleNamespace) -> None:
    """TensorRT's runtime may be absent (here) or present (the documented GPU setup): names that cannot
    exist and the C library stand in for an absent and a present ``libnvinfer``."""
    assert backend.tensorrt_loadable(("libnvinfer-absent.so.99", "libc.so.6")) is True
    assert backend.tensorrt_loadable(("libnvinfer-absent.so.99", "libnvinfer-absent.so.98")) is False
