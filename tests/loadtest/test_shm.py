"""`loadtest --shared-memory system`: regions registered with the real embedded tritonserver, outputs
equal to the HTTP path's (and, over gRPC, to the plain gRPC path's), and no region left behind after a
normal exit or Ctrl-C."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.loadtest.client import endpoint_from_url, post_request_bytes
from pipeline.loadtest.payload import ModelIO, TensorInfo, load_samples, request_batches
from pipeline.loadtest.request_check import raw_exchange
from pipeline.loadtest.shm import (
    REGION_PREFIX,
    SharedMemoryRegions,
    Slot,
    output_byte_sizes,
    read_outputs,
    registered_regions,
    shm_requests,
)
from pipeline.loadtest.targets import model_io
from tests.conftest import interrupt_when_ready, popen_interruptible
from tests.loadtest.test_cli import FAST, run_cli

ROOT = Path(__file__).resolve().parents[2]
ADD = ModelIO("add", (TensorInfo("x", "FP32", (4,)),), (TensorInfo("y", "FP32", (4,)),), 8)


def _leftovers(pid: int | None = None) -> list[str]:
    pattern = f"{REGION_PREFIX}{pid}_*" if pid else f"{REGION_PREFIX}*"
    return sorted(p.name for p in Path("/dev/shm").glob(pattern))


def _ours(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith(REGION_PREFIX)]


def test_output_regions_take_the_models_static_size_or_the_option() -> None:
    assert output_byte_sizes(ADD, 8, None) == {"y": 8 * 4 * 4}
    assert output_byte_sizes(ADD, 8, 4096) == {"y": 4096}
    dynamic = ModelIO("d", ADD.inputs, (TensorInfo("y", "FP32", (-1,)),), 8)
    with pytest.raises(PipelineError, match="--output-shared-memory-size"):
        output_byte_sizes(dynamic, 8, None)


def test_a_grpc_shared_memory_request_names_region_size_and_offset_of_every_tensor_and_carries_no_contents() -> None:
    from tritonclient.grpc import service_pb2

    from pipeline.loadtest.grpc_load import grpc_shm_request_bytes

    io = ModelIO("two", (TensorInfo("a", "FP32", (3,)), TensorInfo("b", "INT64", (2,))), (TensorInfo("y", "FP32", (1,)),), 8)
    tensors = {"a": np.zeros((5, 3), np.float32), "b": np.zeros((5, 2), np.int64)}
    inputs = {"a": Slot("r_in0", 0, 60), "b": Slot("r_in0", 60, 80)}
    request = service_pb2.ModelInferRequest.FromString(grpc_shm_request_bytes(io, tensors, inputs, {"y": Slot("r_out0", 0, 32)}))

    def named(tensor: Any) -> dict[str, Any]:
        return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in tensor.parameters.items()}

    assert request.model_name == "two" and not request.raw_input_contents
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [("a", "FP32", [5, 3]), ("b", "INT64", [5, 2])]
    assert [named(t) for t in request.inputs] == [
        {"shared_memory_region": "r_in0", "shared_memory_byte_size": 60},  # offset 0 left out, as tritonclient does
        {"shared_memory_region": "r_in0", "shared_memory_byte_size": 80, "shared_memory_offset": 60},
    ]
    assert [(t.name, named(t)) for t in request.outputs] == [("y", {"shared_memory_region": "r_out0", "shared_memory_byte_size": 32})]
    # the very request tritonclient's gRPC client builds for the same slots
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc._utils import _get_inference_request

    items = [grpcclient.InferInput(name, list(tensors[name].shape), dtype) for name, dtype in (("a", "FP32"), ("b", "INT64"))]
    for item in items:
        slot = inputs[item.name()]
        item.set_shared_memory(slot.region, slot.byte_size, slot.offset)
    wanted = grpcclient.InferRequestedOutput("y")
    wanted.set_shared_memory("r_out0", 32)
    assert request == _get_inference_request(model_name="two", inputs=items, model_version="", request_id="", outputs=[wanted], sequence_id=0,
                                             sequence_start=False, sequence_end=False, priority=0, timeout=None, parameters=None)


@pytest.mark.slow
def test_shared_memory_outputs_equal_the_http_paths(server: object, workspace: Path) -> None:
    """The tensors a shared-memory request leaves in its output region are those tritonclient's plain
    binary HTTP request returns for the same inputs, to the bit."""
    import tritonclient.http as httpclient

    endpoint = endpoint_from_url(server.http_url)  # type: ignore[attr-defined]
    io = model_io(endpoint, "add")
    batches = request_batches(load_samples(workspace / "calibration" / "add" / "eval.npz"), io, 4, 3)
    client = httpclient.InferenceServerClient(endpoint.address)
    try:
        with SharedMemoryRegions("system", [endpoint]) as regions:
            requests = shm_requests(io, batches, regions, output_byte_sizes(io, 4, None))
            assert set(_ours(registered_regions(endpoint, "system"))) == {f"{regions.tag}out0", *(f"{regions.tag}in{n}" for n in range(3))}
            for body, batch in zip(requests.bodies, batches, strict=True):
                status, _, answer = raw_exchange(endpoint, post_request_bytes(endpoint, "/v2/models/add/infer", body))
                assert status == 200, answer
                ours = read_outputs(regions, json.loads(answer), requests.outputs)["y"]
                item = httpclient.InferInput("x", list(batch["x"].shape), "FP32")
                item.set_data_from_numpy(batch["x"], binary_data=True)
                reference = client.infer("add", [item], outputs=[httpclient.InferRequestedOutput("y", binary_data=True)]).as_numpy("y")
                np.testing.assert_array_equal(ours, reference)
                np.testing.assert_array_equal(ours, batch["x"] + 1)
        assert not _ours(registered_regions(endpoint, "system"))
        assert not _leftovers(os.getpid())
    finally:
        client.close()


@pytest.mark.slow
def test_grpc_shared_memory_requests_leave_the_plain_grpc_paths_outputs(server: object, workspace: Path) -> None:
    """A gRPC request naming the same regions (registered through the HTTP endpoint: they are the server's) carries
    no tensor contents and leaves in its output region what tritonclient's plain gRPC request returns."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2

    from pipeline.loadtest.grpc_load import _grpc_client, check_grpc_shm_request, grpc_shm_request_bytes

    endpoint, grpc_endpoint = endpoint_from_url(server.http_url), endpoint_from_url(server.grpc_url)  # type: ignore[attr-defined]
    io = model_io(endpoint, "add")
    batches = request_batches(load_samples(workspace / "calibration" / "add" / "eval.npz"), io, 4, 2)
    client = _grpc_client(grpc_endpoint)  # past any http_proxy of the environment (gRPC core follows it, even to loopback)
    try:
        with SharedMemoryRegions("system", [endpoint]) as regions:
            requests = shm_requests(io, batches, regions, output_byte_sizes(io, 4, None))
            for batch, slots in zip(batches, requests.inputs, strict=True):
                body = grpc_shm_request_bytes(io, batch, slots, requests.outputs)
                parsed = service_pb2.ModelInferRequest.FromString(body)
                assert not parsed.raw_input_contents and parsed.inputs[0].parameters["shared_memory_region"].string_param == slots["x"].region
                assert parsed.outputs[0].parameters["shared_memory_byte_size"].int64_param == 4 * 4 * 4
                check_grpc_shm_request(grpc_endpoint, io, body, batch, regions, requests.outputs)
                ours = regions.read(requests.outputs["y"].region, 0, np.dtype(np.float32), batch["x"].shape)
                item = grpcclient.InferInput("x", list(batch["x"].shape), "FP32")
                item.set_data_from_numpy(batch["x"])
                np.testing.assert_array_equal(ours, client.infer("add", [item]).as_numpy("y"))
                np.testing.assert_array_equal(ours, batch["x"] + 1)
            # the check reads the regions: a request whose output lands elsewhere leaves the last batch's outputs there
            elsewhere = {"y": Slot(regions.create("elsewhere", None, 4 * 4 * 4), 0, 4 * 4 * 4)}
            body = grpc_shm_request_bytes(io, batches[0], requests.inputs[0], elsewhere)
            with pytest.raises(PipelineError, match="gRPC system shared-memory output 'y' of model 'add' differs"):
                check_grpc_shm_request(grpc_endpoint, io, body, batches[0], regions, requests.outputs)
        assert not _ours(registered_regions(endpoint, "system"))
    finally:
        client.close()


@pytest.mark.slow
def test_loadtest_over_grpc_and_system_shared_memory(server: object, workspace: Path, tmp_path: Path) -> None:
    url, grpc_url = server.http_url, server.grpc_url  # type: ignore[attr-defined]
    status = run_cli("--url", url, "--grpc-url", grpc_url, "--protocol", "grpc", "--model", "add", "--calibration-root",
                     str(workspace / "calibration"), "--batch-size", "4", "--concurrency", "2", "--shared-memory", "system",
                     "--report-dir", str(tmp_path / "r"), *FAST)  # fmt: skip
    assert status == 0
    report = json.loads((tmp_path / "r" / "results.json").read_text())
    (point,) = report["points"]
    assert point["protocol"] == "grpc" and point["encoding"] == "system-shm" and point["aggregate"]["errors"] == {}
    assert point["aggregate"]["client_successes_total"] == point["aggregate"]["server_successes_total"] > 0
    assert not _ours(registered_regions(endpoint_from_url(url), "system"))
    assert not _leftovers(os.getpid())


@pytest.mark.slow
def test_loadtest_over_system_shared_memory(server: object, workspace: Path, tmp_path: Path) -> None:
    """The command runs its sweep over shared memory (its check request compares with tritonclient's
    HTTP outputs first), every request succeeds, and the regions are gone afterwards."""
    url = server.http_url  # type: ignore[attr-defined]
    status = run_cli("--url", url, "--model", "add", "--calibration-root", str(workspace / "calibration"),
                     "--batch-size", "4", "--concurrency", "1,4", "--shared-memory", "system",
                     "--report-dir", str(tmp_path / "r"), *FAST)  # fmt: skip
    assert status == 0
    report = json.loads((tmp_path / "r" / "results.json").read_text())
    assert report["settings"]["shared_memory"] == "system"
    for point in report["points"]:
        assert point["encoding"] == "system-shm"
        assert point["aggregate"]["errors"] == {}
        assert point["aggregate"]["client_successes_total"] == point["aggregate"]["server_successes_total"] > 0
    assert not _ours(registered_regions(endpoint_from_url(url), "system"))
    assert not _leftovers(os.getpid())


@pytest.mark.slow
def test_ctrl_c_unregisters_and_removes_the_regions(server: object, workspace: Path, tmp_path: Path) -> None:
    """A loadtest process sent SIGINT mid-load leaves no region registered with the server and none in /dev/shm."""
    url = server.http_url  # type: ignore[attr-defined]
    endpoint = endpoint_from_url(url)
    command = [sys.executable, "-m", "pipeline", "loadtest", "--url", url, "--model", "add",
               "--calibration-root", str(workspace / "calibration"), "--shared-memory", "system", "--concurrency", "1",
               "--window-ms", "1000", "--warmup-ms", "1000", "--max-seconds", "600", "--report-dir", str(tmp_path / "r")]  # fmt: skip
    paused = tmp_path / "paused"  # held after its first window, mid-load: a stable run cannot end before the signal
    env = dict(os.environ, PIPELINE_PAUSE_AT="loadtest.window", PIPELINE_PAUSE_FILE=str(paused))
    process = popen_interruptible(command, cwd=ROOT, env=env)  # Ctrl-C at its default even where pytest runs with it ignored
    live: list[bool] = []  # at the pause: its regions registered with the server and present in /dev/shm

    def held() -> bool:
        if paused.exists():
            live.append(any(n.startswith(f"{REGION_PREFIX}{process.pid}_") for n in registered_regions(endpoint, "system")) and bool(_leftovers(process.pid)))
        return paused.exists()

    interrupt_when_ready(process, held, "the load test's first window")
    assert live == [True]
    assert not [n for n in registered_regions(endpoint, "system") if n.startswith(f"{REGION_PREFIX}{process.pid}_")]
    assert not _leftovers(process.pid)
