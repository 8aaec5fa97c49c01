"""The embedded tritonserver: real binary, real models, free loopback ports, nothing left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from contextlib import closing
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from pipeline.core.errors import PipelineError
from pipeline.triton.server import TritonServer
from tests.triton.conftest import child_pids, shm_entries, softmax_config, write_model

# Loopback traffic never goes through a proxy, whatever http_proxy/grpc_proxy say.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
NO_PROXY_GRPC = [("grpc.enable_http_proxy", 0)]
X = np.array([[0.0, 1.0, 2.0, 3.0], [-1.0, 0.5, 0.25, 4.0]], dtype=np.float32)


def expected_probs(onnx_path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return session.run(["probs"], {"x": X})[0]


def listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses with a socket in LISTEN state on ``port`` (from /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


@pytest.mark.slow
def test_infers_over_http_grpc_and_plain_kserve_json(server: TritonServer, onnx_models: dict[str, Path]) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    expected = expected_probs(onnx_models["softmax"])

    inp = httpclient.InferInput("x", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    with closing(httpclient.InferenceServerClient(server.http_url)) as http:
        np.testing.assert_allclose(http.infer("tiny", [inp]).as_numpy("probs"), expected, rtol=1e-6, atol=1e-7)

    ginp = grpcclient.InferInput("x", list(X.shape), "FP32")
    ginp.set_data_from_numpy(X)
    with closing(grpcclient.InferenceServerClient(server.grpc_url, channel_args=NO_PROXY_GRPC)) as grpc:
        np.testing.assert_allclose(grpc.infer("tiny_noopt", [ginp]).as_numpy("probs"), expected, rtol=1e-6, atol=1e-7)

    body = {"inputs": [{"name": "x", "shape": list(X.shape), "datatype": "FP32", "data": X.ravel().tolist()}]}
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/tiny/infer", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with _DIRECT.open(request, timeout=10) as response:
        output = json.load(response)["outputs"][0]
    assert output["name"] == "probs" and output["shape"] == [2, 3]
    np.testing.assert_allclose(np.array(output["data"], dtype=np.float32).reshape(2, 3), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_endpoints_listen_on_loopback_only(server: TritonServer) -> None:
    # 127.0.0.1 as /proc/net/tcp writes it, and as /proc/net/tcp6 writes ::ffff:127.0.0.1 (gRPC binds so)
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}
    for port in (server.http_port, server.grpc_port, server.metrics_port):
        addresses = listening_addresses(port)
        assert addresses and addresses <= loopback, f"port {port} listens on {addresses}"
    with _DIRECT.open(f"http://{server.metrics_url}/metrics", timeout=10) as response:
        assert b"nv_inference_count" in response.read()


@pytest.mark.slow
def test_plan_model_is_skipped_with_reason_and_the_rest_serve(server: TritonServer, repository: Path) -> None:
    assert set(server.skipped_models) == {"tiny_fp32_trt"}
    assert "TensorRT" in server.skipped_models["tiny_fp32_trt"]
    assert server.ready_models == ["ids", "tiny", "tiny_fixed", "tiny_noopt"]
    assert (repository / "tiny_fp32_trt" / "1" / "model.plan").is_file()  # the on-disk repository is untouched
    with pytest.raises(urllib.error.HTTPError):
        _DIRECT.open(f"http://{server.http_url}/v2/models/tiny_fp32_trt/ready", timeout=10)


@pytest.mark.slow
def test_port_in_use_is_one_clear_error_and_starts_nothing(repository: Path, tmp_path: Path) -> None:
    before = child_pids()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(PipelineError) as error:
            TritonServer(repository, grpc_port=port, log_path=tmp_path / "t.log").start()
    assert f"port {port}" in error.value.problem and "grpc" in error.value.problem
    assert "--grpc-port" in (error.value.fix or "")
    assert child_pids() == before


class _RacedServer(TritonServer):
    """Its first pick of free ports hands out a port another process took meanwhile (the race that
    a client's outgoing connection or a second server starting at the same moment can cause)."""

    def __init__(self, *args, taken: int, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.taken, self.picks = taken, []

    def _assign_ports(self) -> None:
        super()._assign_ports()
        if not self.picks:
            self.http_port = self.taken
        self.picks.append(self.http_port)


@pytest.mark.slow
def test_a_free_port_taken_before_the_server_binds_it_is_picked_again(repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        caplog.set_level("INFO", logger="pipeline.triton.server")
        with _RacedServer(repository, taken=taken, log_path=tmp_path / "t.log") as server:
            assert server.picks[0] == taken and server.http_port not in (taken, 0)
            assert "tiny" in server.ready_models
            with _DIRECT.open(f"http://{server.http_url}/v2/health/ready", timeout=5) as response:
                assert response.status == 200
    assert any(f"127.0.0.1:{taken} is already in use; picking free ports again" in r.getMessage() for r in caplog.records)


def test_missing_repository_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="does not exist"):
        TritonServer(tmp_path / "nope").start()


def test_empty_repository_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="has no models"):
        TritonServer(tmp_path).start()


def test_repository_of_only_plans_is_a_clear_error(tmp_path: Path) -> None:
    write_model(tmp_path, softmax_config("m_fp16_trt", platform="tensorrt_plan"), b"fake", filename="model.plan")
    with pytest.raises(PipelineError, match="none of the models") as error:
        TritonServer(tmp_path).start()
    assert "m_fp16_trt" in error.value.problem


@pytest.mark.slow
def test_corrupt_model_file_names_the_model_and_leaves_nothing(tmp_path: Path, onnx_models: dict[str, Path]) -> None:
    repo = tmp_path / "repo"
    write_model(repo, softmax_config("good"), onnx_models["softmax"].read_bytes())
    write_model(repo, softmax_config("broken"), b"\x08\x07garbage, not a protobuf")
    before_pids, before_shm = child_pids(), shm_entries()
    with pytest.raises(PipelineError) as error:
        TritonServer(repo, log_path=tmp_path / "t.log").start()
    message = str(error.value)
    assert "model 'broken' failed to load" in message
    # the cause from the log, as one line naming the user's file (not the server's private view)
    assert f"{(repo / 'broken' / '1' / 'model.onnx').resolve()}: [ONNXRuntimeError]" in message
    assert "\n" not in message and "\\n" not in message
    assert "'good'" not in message
    assert str(tmp_path / "t.log") in message
    assert child_pids() == before_pids
    assert shm_entries() == before_shm


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (dead, waiting for init to reap it) does not count."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_pinned_server_killed_hard_still_leaves_nothing_after_stop(repository: Path, tmp_path: Path) -> None:
    """Pinning reaches the stubs; a SIGKILLed server orphans stubs and segments, and stop() removes both."""
    before_pids, before_shm = child_pids(), shm_entries()
    server = TritonServer(repository, cpus=[0], log_path=tmp_path / "pinned.log")
    server.start()
    try:
        assert server.pid is not None
        assert "Cpus_allowed_list:\t0\n" in Path(f"/proc/{server.pid}/status").read_text()
        stubs = child_pids(server.pid)
        assert len(stubs) == len(server.ready_models), "one Python backend stub per model instance"
        for pid in stubs:
            assert "Cpus_allowed_list:\t0\n" in Path(f"/proc/{pid}/status").read_text()
        assert shm_entries() - before_shm, "the Python backend uses shared memory while serving"
        # ONNX Runtime sizes its pool to the pinned share, not the machine, when the config sets no count
        assert re.search(r"tiny/1/model\.onnx: graph_optimization_level=\S+ intra_op_threads=1 ", server.log_path.read_text())
        os.kill(server.pid, signal.SIGKILL)
        time.sleep(0.5)
        assert not server.is_running()
    finally:
        server.stop()
    assert child_pids() == before_pids
    assert not [pid for pid in stubs if alive(pid)]
    assert shm_entries() == before_shm


@pytest.mark.slow
def test_loopback_traffic_ignores_an_unreachable_proxy(repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With http_proxy pointing nowhere, the server still starts (its readiness polls go direct) and
    serves; a client that honoured the proxy would fail, which shows the proxy setting is live."""
    import tritonclient.grpc as grpcclient

    for name in ("http_proxy", "HTTP_PROXY", "grpc_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # discard port: nothing answers
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    write_model(tmp_path / "repo", softmax_config("tiny"), (repository / "tiny" / "1" / "model.onnx").read_bytes())
    with TritonServer(tmp_path / "repo", log_path=tmp_path / "t.log") as server:
        assert server.ready_models == ["tiny"]
        with pytest.raises(urllib.error.URLError):
            urllib.request.build_opener().open(f"http://{server.http_url}/v2/health/ready", timeout=5)  # via the proxy
        assert _DIRECT.open(f"http://{server.http_url}/v2/health/ready", timeout=5).status == 200
        with closing(grpcclient.InferenceServerClient(server.grpc_url, channel_args=NO_PROXY_GRPC)) as grpc:
            assert grpc.is_server_ready()


@pytest.mark.slow
def test_admin_key_restricts_the_repository_api_and_readiness_still_works(
    repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With an admin key (serve --restricted-api), the server's own readiness checks send the key:
    it starts, and the repository API answers only requests that carry it. The key is in no log line
    (ours at DEBUG, the server's file); Triton 2.51 reads it only from its command line (README)."""
    write_model(tmp_path / "repo", softmax_config("tiny"), (repository / "tiny" / "1" / "model.onnx").read_bytes())
    caplog.set_level("DEBUG", logger="pipeline")
    with TritonServer(tmp_path / "repo", log_path=tmp_path / "t.log", model_control="explicit", admin_key="s3cret") as server:
        assert "--http-restricted-api=" in caplog.text and "admin-key=***" in caplog.text
        assert "s3cret" not in caplog.text and "s3cret" not in (tmp_path / "t.log").read_text()
        assert server.ready_models == ["tiny"]
        index = f"http://{server.http_url}/v2/repository/index"
        with pytest.raises(urllib.error.HTTPError) as denied:
            _DIRECT.open(urllib.request.Request(index, data=b"{}"), timeout=10)
        assert denied.value.code == 403
        with _DIRECT.open(urllib.request.Request(index, data=b"{}", headers={"admin-key": "s3cret"}), timeout=10) as ok:
            assert [m["name"] for m in json.load(ok)] == ["tiny"]


def test_a_gpu_config_that_cannot_load_gets_gpu_advice_not_rebuild_advice(tmp_path: Path) -> None:
    """The line Triton 2.51 logs for a KIND_GPU instance group on a server that sees no GPU."""
    from pipeline.triton.server_log import startup_error

    log = tmp_path / "t.log"
    log.write_text(
        "E1130 10:00:00.000000 1 model_lifecycle.cc:654] \"failed to load 'tiny' version 1: Invalid argument: "
        "instance group tiny_0 of model tiny specifies invalid or unsupported gpu id 0. GPUs with at least the "
        "minimum required CUDA compute compatibility of 6.000000 are: KIND_GPU but no GPUs are available\"\n"
    )
    error = startup_error(log, 1, {})
    assert "model 'tiny' failed to load" in error.problem
    assert "GPU is visible" in (error.fix or "") and "rebuild" not in (error.fix or "")


def test_gpu_instances_need_onnxruntime_gpu_and_the_error_names_the_extra(tmp_path: Path) -> None:
    """On a machine with a GPU, Triton gives KIND_AUTO (or unset) and KIND_GPU ONNX models GPU instances;
    this venv's real ONNX Runtime (the CPU build) cannot run them, which is one clear line before start."""
    import onnxruntime

    from pipeline.triton.servable import gpu_instance_models, require_gpu_runtime

    configs = {
        "auto": 'platform: "onnxruntime_onnx"\ninstance_group { kind: KIND_AUTO }',
        "unset": 'platform: "onnxruntime_onnx"',
        "gpu": 'backend: "onnxruntime"\ninstance_group { kind: KIND_GPU count: 2 }',
        "cpu": 'platform: "onnxruntime_onnx"\ninstance_group { kind: KIND_CPU }',
        "plan": 'platform: "tensorrt_plan"\ninstance_group { kind: KIND_GPU }',
    }
    for name, text in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n{text}\n')
    chosen = gpu_instance_models(tmp_path, sorted(configs))
    assert chosen == ["auto", "gpu", "unset"]
    with pytest.raises(PipelineError) as err:
        require_gpu_runtime(chosen, onnxruntime.get_available_providers())
    assert "auto, gpu, unset GPU instances" in err.value.problem and "CPU build" in err.value.problem
    assert "'gpu-serve' extra" in err.value.fix and "CUDA_VISIBLE_DEVICES=" in err.value.fix
    require_gpu_runtime(chosen, ["CUDAExecutionProvider", "CPUExecutionProvider"])  # onnxruntime-gpu: fine
    require_gpu_runtime([], onnxruntime.get_available_providers())  # nothing asks for a GPU: fine
