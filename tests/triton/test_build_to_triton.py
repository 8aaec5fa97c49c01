"""End to end: `python -m pipeline build --fp16 --int8` → Triton repository → the real tritonserver.

One default-model build (FP32 + FP16 + INT8, ~40-90 s cold) is shared by every test here and by
tests/triton/test_verify.py (see :func:`built_digits`). Tests that change the repository work on a copy.
Nothing is mocked: real tf2onnx build, real ONNX Runtime, real tritonserver, real CLI processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.backend.onnxrt import session_from_onnx
from pipeline.triton.config import check_config_against_onnx, parse_config
from pipeline.triton.repository import read_repository
from pipeline.triton.server import TritonServer
from tests.conftest import ROOT, Built, cli, one_line_error
from tests.triton.test_serve_cli import processes_mentioning
from tests.triton.test_server import listening_addresses

pytestmark = pytest.mark.slow

MODELS = ("digits_fp16", "digits_fp32", "digits_int8", "digits_int8cpu")  # int8cpu: the CPU INT8, on by default with --int8
CALIBRATION = ROOT / "calibration" / "digits"
# Served and in-process runs of the same file on the same ONNX Runtime must agree this closely.
ATOL = 1e-5
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # our own loopback server, whatever http_proxy says


@pytest.fixture(scope="module")
def served(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    with TritonServer(built.repository, log_path=tmp_path_factory.mktemp("e2e-logs") / "tritonserver.log") as server:
        yield server


def eval_images(count: int) -> np.ndarray:
    with np.load(CALIBRATION / "eval.npz", allow_pickle=False) as data:
        return np.ascontiguousarray(data["image"][:count].astype(np.float32))


def in_process(repository: Path, model: str, version: int, images: np.ndarray) -> np.ndarray:
    """The served file run in this process; INT8 with exact Q/DQ semantics, as its config asks Triton to (the CPU INT8
    with ORT's graph optimizations on, as its config leaves them)."""
    session = session_from_onnx(repository / model / str(version) / "model.onnx", exact_qdq=model.endswith("_int8"))
    return session.run(["probs"], {"image": images})[0]


def model_versions(repository: Path) -> dict[str, list[int]]:
    return {
        d.name: sorted(int(v.name) for v in d.iterdir() if v.is_dir() and v.name.isdigit())
        for d in sorted(repository.iterdir()) if d.is_dir() and not d.name.startswith(".")
    }


def assert_complete(repository: Path) -> None:
    """Every model directory loads as Triton would: a parsing config matching each version's ONNX file."""
    for name, model in read_repository(repository).items():  # parses every config.pbtxt
        assert model.config.name == name
        for version in model.versions:
            model_file = model.path / str(version) / "model.onnx"
            assert model_file.is_file(), model_file
            check_config_against_onnx(model.config, model_file)
        for output in model.config.output:
            if output.label_filename:
                assert (model.path / output.label_filename).is_file()
        for sample in model.config.model_warmup:
            for item in sample.inputs.values():
                assert (model.path / "warmup" / item.input_data_file).is_file()


def copy_repository(built: Built, dst: Path) -> Path:
    shutil.copytree(built.repository, dst, symlinks=True)
    return dst


# -- the repository the build publishes ---------------------------------------------------------


def test_every_config_parses_and_matches_its_onnx_model(built: Built) -> None:
    assert sorted(p.name for p in built.repository.iterdir()) == list(MODELS)
    sample = eval_images(1)[0]
    for name in MODELS:
        model_dir = built.repository / name
        cfg = parse_config((model_dir / "config.pbtxt").read_text())
        assert cfg.name == name and cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 64
        assert [i.name for i in cfg.input] == ["image"] and [o.name for o in cfg.output] == ["probs"]
        check_config_against_onnx(cfg, model_dir / "1" / "model.onnx")
        # Only the Q/DQ model for TensorRT turns ONNX Runtime's graph optimizations off (2 = ORT_DISABLE_ALL in Triton's
        # backend); the CPU INT8 keeps them (its integer kernels are the point) and asks for CPU instances only.
        assert cfg.optimization.HasField("graph") == (name == "digits_int8")
        if name == "digits_int8":
            assert cfg.optimization.graph.level == 2
        kinds = [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in cfg.instance_group]
        assert kinds == (["KIND_CPU"] if name == "digits_int8cpu" else ["KIND_AUTO"]), (name, kinds)
        if name == "digits_int8cpu":  # CPU instances only: no GPU accelerators
            assert not cfg.HasField("optimization")
        else:
            # GPU instances: TensorRT at the variant's precision over a batch 1..64 profile, CUDA without TF32.
            trt, cuda = cfg.optimization.execution_accelerators.gpu_execution_accelerator
            assert (trt.name, trt.parameters["precision_mode"], cuda.name, dict(cuda.parameters)) == (
                "tensorrt", name.rsplit("_", 1)[1].upper(), "cuda", {"use_tf32": "0"})
            assert trt.parameters["trt_profile_max_shapes"] == "image:64x8x8x1"
        assert cfg.output[0].label_filename == "labels.txt"
        assert (model_dir / "labels.txt").read_text() == (CALIBRATION / "labels.txt").read_text()
        assert sorted(w.batch_size for w in cfg.model_warmup) == [1, 32, 64]
        for warmup in cfg.model_warmup:
            item = warmup.inputs["image"]
            assert list(item.dims) == [8, 8, 1]
            # the real first evaluation sample, raw little-endian float32
            assert (model_dir / "warmup" / item.input_data_file).read_bytes() == sample.astype("<f4").tobytes()
    assert_complete(built.repository)


def test_deploy_bundle_is_written_beside_the_repository(built: Built) -> None:
    """The build (not the fixture) put the bundle in deploy/ beside the repository, pointing at it."""
    bundle = built.repository.parent / "deploy"
    assert sorted(p.name for p in bundle.iterdir()) == [".pipeline-bundle.json", "README.md", "compose.yaml", "docker-run.sh"]
    compose = yaml.safe_load((bundle / "compose.yaml").read_text())
    [service] = compose["services"].values()
    assert (bundle / service["volumes"][0]["source"]).resolve() == built.repository.resolve()
    script = bundle / "docker-run.sh"
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    assert "tritonserver" in script.read_text()


# -- the real server on the built repository ------------------------------------------------------


def test_served_outputs_equal_in_process_over_http_grpc_and_kserve_json(built: Built, served: TritonServer) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    assert served.ready_models == list(MODELS) and not served.skipped_models
    images = eval_images(5)
    for name in MODELS:
        expected = in_process(built.repository, name, 1, images)

        inp = httpclient.InferInput("image", list(images.shape), "FP32")
        inp.set_data_from_numpy(images)
        with closing(httpclient.InferenceServerClient(served.http_url)) as http:
            result = http.infer(name, [inp], outputs=[httpclient.InferRequestedOutput("probs")])
            np.testing.assert_allclose(result.as_numpy("probs"), expected, rtol=0, atol=ATOL, err_msg=f"{name} over HTTP")
            # Triton's classification extension reads labels.txt: "score:index:label", best first.
            top = http.infer(name, [inp], outputs=[httpclient.InferRequestedOutput("probs", class_count=1)]).as_numpy("probs")
            labels = (CALIBRATION / "labels.txt").read_text().split()
            assert [row[0].decode().split(":")[2] for row in top] == [labels[i] for i in expected.argmax(1)]

        ginp = grpcclient.InferInput("image", list(images.shape), "FP32")
        ginp.set_data_from_numpy(images)
        direct = [("grpc.enable_http_proxy", 0)]  # gRPC core would send even loopback calls through http_proxy
        with closing(grpcclient.InferenceServerClient(served.grpc_url, channel_args=direct)) as grpc:
            got = grpc.infer(name, [ginp]).as_numpy("probs")
            np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL, err_msg=f"{name} over gRPC")

        body = {"inputs": [{"name": "image", "shape": list(images.shape), "datatype": "FP32", "data": images.ravel().tolist()}]}
        request = urllib.request.Request(
            f"http://{served.http_url}/v2/models/{name}/infer", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with _DIRECT.open(request, timeout=30) as response:
            output = json.load(response)["outputs"][0]
        assert output["name"] == "probs" and output["shape"] == [5, 10] and output["datatype"] == "FP32"
        np.testing.assert_allclose(
            np.array(output["data"], dtype=np.float32).reshape(5, 10), expected, rtol=0, atol=ATOL, err_msg=f"{name} as KServe v2 JSON"
        )


def test_endpoints_listen_on_loopback_only(served: TritonServer) -> None:
    # 127.0.0.1 as /proc/net/tcp writes it, and as /proc/net/tcp6 writes ::ffff:127.0.0.1 (gRPC binds so)
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}
    for port in (served.http_port, served.grpc_port, served.metrics_port):
        addresses = listening_addresses(port)
        assert addresses and addresses <= loopback, f"port {port} listens on {addresses}"


# -- a build killed midway --------------------------------------------------------------------------


def serve_one_sample_each(repository: Path, log_path: Path) -> None:
    """Start the real server on ``repository``; every model is ready and answers like in process."""
    import tritonclient.http as httpclient

    image = eval_images(1)
    versions = model_versions(repository)
    with TritonServer(repository, log_path=log_path) as server:
        assert server.ready_models == sorted(versions), server.ready_models
        with closing(httpclient.InferenceServerClient(server.http_url)) as http:
            for name, numbers in versions.items():
                inp = httpclient.InferInput("image", [1, 8, 8, 1], "FP32")
                inp.set_data_from_numpy(image)
                # Triton serves the newest version by default (version_policy latest 1)
                got = http.infer(name, [inp]).as_numpy("probs")
                np.testing.assert_allclose(got, in_process(repository, name, numbers[-1], image), rtol=0, atol=ATOL)


def start_paused(command: list[str], env: dict[str, str], pause_at: str, marker: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` with the pause-point test hook (pipeline/core/pausepoints.py) and return once it holds at ``pause_at``."""
    marker.unlink(missing_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=dict(env, PIPELINE_PAUSE_AT=pause_at, PIPELINE_PAUSE_FILE=str(marker)),
                                stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600  # a hang guard, not a speed limit
    while not marker.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill(proc)
            pytest.fail(f"the build never paused at {pause_at} (exit {proc.returncode}): {log_path.read_text()[-2000:]}")
        time.sleep(0.05)
    assert int(marker.read_text()) == proc.pid
    return proc


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


def changed_models(repository: Path, before: dict[str, list[int]]) -> set[str]:
    return {name for name, versions in model_versions(repository).items() if before.get(name) != versions}


def test_build_killed_midway_leaves_the_previous_repository_servable(built: Built, tmp_path: Path) -> None:
    """SIGKILL a `build --fp16 --int8 --version-policy new` at several moments; the repository stays servable.

    The workdir starts as a copy of the shared build's FP32 stages, so those are cached and each killed
    build reaches the INT8 and publish stages within seconds. The build holds at named pause points
    (the test hook in pipeline/core/pausepoints.py) until it is killed, so every moment is hit exactly:
    during start-up (before any stage), between two INT8 calibration batches, with every model staged
    beside the repository and none swapped in, and between the first and second model swap.
    """
    workdir, repository = tmp_path / "build", tmp_path / "model_repository"
    shutil.copytree(built.workdir / "digits", workdir / "digits", symlinks=True,
                    ignore=shutil.ignore_patterns("model.fp16.onnx*", "model.int8.onnx*", "accuracy.json*", "published.json*", "manifest.json"))
    base = ("build", "--workdir", str(workdir), "--repository", str(repository))
    first = cli(*base)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert model_versions(repository) == {"digits_fp32": [1]}
    original = {p.relative_to(repository): p.read_bytes() for p in (repository / "digits_fp32" / "1").rglob("*") if p.is_file()}

    ws = workdir / "digits"
    staging = repository.parent / f".{repository.name}.pipeline-staging"
    command = [sys.executable, "-m", "pipeline", *base, "--fp16", "--int8", "--version-policy", "new"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    marker = tmp_path / "paused"

    # each (pause point, what holds while paused, which models a kill there leaves changed)
    moments = [
        ("int8.calibration-batch#2", lambda: any(p.is_dir() for p in ws.glob(".model.int8.onnx.*")), 0),
        ("publish.swap#1", staging.is_dir, 0),
        ("publish.swap#2", staging.is_dir, 1),
    ]
    for index, (pause_at, holds, changed) in enumerate(moments, start=1):
        before = model_versions(repository)
        proc = start_paused(command, env, pause_at, marker, tmp_path / f"killed-build-{index}.log")
        try:
            assert holds(), f"paused at {pause_at} but its moment does not hold"
            assert len(changed_models(repository, before)) == changed, (pause_at, before, model_versions(repository))
        finally:
            kill(proc)
        assert proc.returncode == -signal.SIGKILL, pause_at
        # what the killed build left: the same models changed as while it was paused, each one complete
        assert len(changed_models(repository, before)) == changed, (pause_at, before, model_versions(repository))
        assert_complete(repository)
        assert {p.relative_to(repository): p.read_bytes() for p in (repository / "digits_fp32" / "1").rglob("*") if p.is_file()} == original
        serve_one_sample_each(repository, tmp_path / "server.log")

    before = model_versions(repository)
    final = cli(*base, "--fp16", "--int8", "--version-policy", "new")
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    after = model_versions(repository)
    assert set(after) == set(MODELS)
    assert after["digits_fp32"] == before["digits_fp32"] == [1]  # unchanged FP32 is never republished
    for name in ("digits_fp16", "digits_int8", "digits_int8cpu"):
        # published exactly once (by the build killed between swaps, or by this one), with the built file
        assert len(after[name]) == 1 and after[name][:len(before.get(name, []))] == before.get(name, []), (before, after)
        variant = name.split("_")[1]
        assert (repository / name / str(after[name][0]) / "model.onnx").read_bytes() == (ws / f"model.{variant}.onnx").read_bytes()
    assert_complete(repository)
    serve_one_sample_each(repository, tmp_path / "server.log")
    leftovers = [p.name for p in (workdir / "digits").iterdir() if p.name.startswith(".model.")]
    assert not leftovers, f"killed stages' temporaries were not cleared: {leftovers}"


# -- bad inputs to `python -m pipeline serve` ---------------------------------------------------------


def serve_cli(tmp_path: Path, repository: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the real `python -m pipeline serve` until it exits; return it and its pid."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", COLUMNS="300")
    command = [sys.executable, "-m", "pipeline", "serve", "--repository", str(repository),
               "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--log-file", str(tmp_path / "serve.log"), *args]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, out, err), process.pid


def pgrep(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)  # exit 1: none
    return [int(pid) for pid in found.stdout.split()]


def _missing(built: Built, tmp_path: Path) -> tuple[Path, tuple[str, ...], list[str]]:
    return tmp_path / "no_such_repository", (), ["does not exist"]


def _empty(built: Built, tmp_path: Path) -> tuple[Path, tuple[str, ...], list[str]]:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty", (), ["has no models"]


def _corrupt_model(built: Built, tmp_path: Path) -> tuple[Path, tuple[str, ...], list[str]]:
    repository = copy_repository(built, tmp_path / "repo")
    (repository / "digits_fp16" / "1" / "model.onnx").write_bytes(b"\x08\x07garbage, not an ONNX protobuf")
    return repository, (), ["model 'digits_fp16' failed to load", str((repository / "digits_fp16" / "1" / "model.onnx").resolve())]


def _io_mismatch(built: Built, tmp_path: Path) -> tuple[Path, tuple[str, ...], list[str]]:
    repository = copy_repository(built, tmp_path / "repo")
    path = repository / "digits_fp32" / "config.pbtxt"
    cfg = parse_config(path.read_text())
    cfg.output[0].name = "scores"
    path.write_text(text_format.MessageToString(cfg))
    return repository, (), ["model 'digits_fp32' failed to load", "'scores'"]


@pytest.mark.parametrize("case", [_missing, _empty, _corrupt_model, _io_mismatch], ids=["missing", "empty", "corrupt-model", "io-mismatch"])
def test_serve_bad_repository_is_one_line_and_leaves_no_server(
    case: Callable[[Built, Path], tuple[Path, tuple[str, ...], list[str]]], built: Built, tmp_path: Path
) -> None:
    repository, args, wanted = case(built, tmp_path)
    proc, pid = serve_cli(tmp_path, repository, *args)
    line = one_line_error(proc)
    for text in wanted:
        assert text in line, line
    assert "\\n" not in line
    others = set(MODELS) - {w.split("'")[1] for w in wanted if w.startswith("model '")}
    if "failed to load" in line:
        assert not any(f"model '{name}'" in line for name in others), line
    assert pgrep(f"pipeline_triton_{pid}_") == []  # the server and its backend stubs carry this prefix
    assert processes_mentioning(str(tmp_path)) == []


def test_serve_port_in_use_is_one_line_and_starts_nothing(built: Built, tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        proc, pid = serve_cli(tmp_path, built.repository, "--http-port", str(port))
    line = one_line_error(proc)
    assert f"port {port}" in line and "http" in line and "--http-port" in line, line
    assert pgrep(f"pipeline_triton_{pid}_") == []
    assert processes_mentioning(str(tmp_path)) == []
