"""Plans loaded after the server starts (pipeline/triton/plan_loader.py): one that its TensorRT refuses takes no model
down. The bundle's own loader script runs against the embedded tritonserver (explicit model control, the admin key,
the repository API, all real). TensorRT cannot run here, so the one seam replaced is the plan's deserialization:
the plans are stand-ins, one an ONNX model that loads, one a Python model whose load fails with TensorRT's own
version-mismatch message (Triton issue #5975), as a plan built by another TensorRT fails in the real server."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.triton.plan_loader import LOADER_SOURCE, polygraphy_wheel, serve_then_load
from pipeline.triton.server import TritonServer
from tests.conftest import Built

MISMATCH = ("The engine plan file is not compatible with this version of TensorRT, expecting library version 10.3.0.26 got "
            "10.8.0.43, please rebuild.")
REFUSING_PLAN = f'''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise pb_utils.TritonModelException({MISMATCH!r})

    def execute(self, requests):
        return []
'''


def _plans(built: Built, folder: Path) -> Path:
    good = folder / "digits_fp16_trt"
    shutil.copytree(built.repository / "digits_fp16", good)
    config = good / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "digits_fp16"', 'name: "digits_fp16_trt"'))
    bad = folder / "digits_int8_trt"
    (bad / "1").mkdir(parents=True)
    (bad / "1" / "model.py").write_text(REFUSING_PLAN)
    (bad / "config.pbtxt").write_text('name: "digits_int8_trt"\nbackend: "python"\nmax_batch_size: 0\n'
                                      'input { name: "image" data_type: TYPE_FP32 dims: [-1, 8, 8, 1] }\n'
                                      'output { name: "probs" data_type: TYPE_FP32 dims: [-1, 10] }\n'
                                      'instance_group { kind: KIND_CPU count: 1 }\n')
    return folder


@pytest.mark.slow
def test_a_plan_its_tensorrt_refuses_is_one_line_and_every_other_model_serves(built: Built, tmp_path: Path) -> None:
    import tritonclient.http as http

    plans = _plans(built, tmp_path / "plans")
    loader = tmp_path / "load-plans.py"
    loader.write_text(LOADER_SOURCE)
    key = "test-admin-key"
    # as the bundle starts it: the plans' repository beside, readiness not strict (one failed plan would hold it at 400)
    with TritonServer(built.repository, workdir=tmp_path / "serve", model_control="explicit", admin_key=key,
                      extra_args=[f"--model-repository={plans}", "--strict-readiness=false"]) as server:
        env = dict(os.environ, TRITON_ADMIN_KEY=key)
        done = subprocess.run([sys.executable, str(loader), str(plans), f"http://{server.http_url}"], capture_output=True, text=True, env=env, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert "plan digits_fp16_trt: loaded" in lines, lines
        [refused] = [line for line in lines if line.startswith("plan digits_int8_trt:")]
        assert refused.startswith("plan digits_int8_trt: not loaded, the other models serve on: ") and "not compatible with this version of TensorRT" in refused
        assert lines[-1] == "1 of 2 plans loaded"
        client = http.InferenceServerClient(server.http_url)
        image = np.zeros((2, 8, 8, 1), np.float32)
        for model in ("digits_fp32", "digits_int8cpu", "digits_fp16_trt"):  # the ONNX variants and the plan that loaded answer
            tensor = http.InferInput("image", list(image.shape), "FP32")
            tensor.set_data_from_numpy(image)
            assert client.infer(model, [tensor]).as_numpy("probs").shape == (2, 10), model
        assert not client.is_model_ready("digits_int8_trt") and client.is_server_ready() and server.is_running
        # without the key the repository API refuses: the loader's load is the admin's, not anyone's
        unkeyed = subprocess.run([sys.executable, str(loader), str(plans), f"http://{server.http_url}"], capture_output=True, text=True,
                                 env=dict(env, TRITON_ADMIN_KEY=""), timeout=120, check=False)
        assert "plan digits_fp16_trt: not loaded" in unkeyed.stdout


def _container(tmp_path: Path, server_body: str, loader_body: str) -> subprocess.Popen[bytes]:
    server = tmp_path / "server.sh"
    server.write_text(server_body)
    loader = tmp_path / "loader.py"
    loader.write_text(loader_body)
    # after a setup step, as the bundle runs it (`<engine cache setup> && ...`)
    shell = f"mkdir -p {tmp_path}/cache && " + serve_then_load(f"bash {server}", 8000, loader=str(loader), plans_dir=str(tmp_path))
    # a session of its own: the stand-in loader outlives the shell (in a container, the container's end stops it)
    return subprocess.Popen(["bash", "-c", shell], env=dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"),
                            start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Everything the container shell started, as the container's end would."""
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _until(path: Path) -> None:
    for _ in range(200):
        if path.exists():
            return
        subprocess.run(["sleep", "0.05"], check=True)
    raise AssertionError(f"{path} never appeared")


def test_the_container_runs_the_server_and_passes_a_stop_on_at_once(tmp_path: Path) -> None:
    """The server and the loader run side by side; a TERM to the container's shell reaches the server while the loader
    is still waiting (a stand-in server records the signal; the stand-in loader sleeps), and the shell exits with it."""
    server = f"trap 'echo stopped > {tmp_path}/signal; exit 0' TERM\necho started > {tmp_path}/started\nwhile true; do sleep 0.05; done\n"
    loader = f"import sys, time\nopen({str(tmp_path / 'loading')!r}, 'w').write(' '.join(sys.argv[1:]))\ntime.sleep(600)\n"
    proc = _container(tmp_path, server, loader)
    try:
        _until(tmp_path / "started")
        _until(tmp_path / "loading")
        assert (tmp_path / "loading").read_text() == f"{tmp_path} http://127.0.0.1:8000"  # the plans, and the server's own port
        proc.terminate()
        assert proc.wait(timeout=10) == 0  # at once, though the loader still sleeps
        assert (tmp_path / "signal").read_text().strip() == "stopped"
    finally:
        _stop(proc)


def test_a_server_that_dies_ends_the_container(tmp_path: Path) -> None:
    """A server that exits at start (a model that does not load, --exit-on-error) ends the shell with its status, while
    the loader would still be waiting for it: the container stops and its restart policy applies."""
    proc = _container(tmp_path, "exit 3\n", "import time\ntime.sleep(600)\n")
    try:
        assert proc.wait(timeout=10) == 3
    finally:
        _stop(proc)


def test_the_shipped_polygraphy_wheel_installs_offline_and_runs(tmp_path: Path) -> None:
    """The bundle's wheels/ Polygraphy: pip installs it with no index, and its console script answers."""
    name, data = polygraphy_wheel()
    wheel = tmp_path / name
    wheel.write_bytes(data)
    assert polygraphy_wheel()[1] == data  # reproducible: the same bytes every time
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(target), str(wheel)],
                         capture_output=True, text=True, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert (target / "polygraphy" / "__init__.py").is_file() and (target / "bin" / "polygraphy").is_file()
    env = dict(os.environ, PYTHONPATH=str(target))
    run = subprocess.run([sys.executable, str(target / "bin" / "polygraphy"), "--version"], capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 0 and "Polygraphy" in run.stdout + run.stderr, run.stdout + run.stderr
