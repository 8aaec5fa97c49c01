"""Plans loaded after the server starts (pipeline/triton/plan_loader.py): one that its TensorRT refuses takes no model
down. The bundle's own loader script runs against the embedded tritonserver (explicit model control, the admin key,
the repository API, all real). TensorRT cannot run here, so the one seam replaced is the plan's deserialization:
the plans are stand-ins, one an ONNX model that loads, one a Python model whose load fails with TensorRT's own
version-mismatch message (Triton issue #5975), as a plan built by another TensorRT fails in the real server."""

from __future__ import annotations

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
        env = dict(os.environ, TRITON_URL=f"http://{server.http_url}", TRITON_ADMIN_KEY=key)
        done = subprocess.run([sys.executable, str(loader), str(plans)], capture_output=True, text=True, env=env, timeout=120, check=False)
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
        unkeyed = subprocess.run([sys.executable, str(loader), str(plans)], capture_output=True, text=True,
                                 env=dict(env, TRITON_ADMIN_KEY=""), timeout=120, check=False)
        assert "plan digits_fp16_trt: not loaded" in unkeyed.stdout


def test_the_container_runs_the_server_and_passes_a_stop_on(tmp_path: Path) -> None:
    """The shell of the server's container: the server in the background, the loader, then the server waited on; a
    TERM to the shell reaches the server (bash, with a stand-in server that records the signal)."""
    server = tmp_path / "server.sh"
    server.write_text(f"trap 'echo stopped > {tmp_path}/signal; exit 0' TERM\necho started > {tmp_path}/started\nwhile true; do sleep 0.1; done\n")
    loader = tmp_path / "loader.py"
    loader.write_text(f"open({str(tmp_path / 'loaded')!r}, 'w').write('yes')\n")
    # after a setup step, as the bundle runs it (`<engine cache setup> && ...`): the signal must still reach the server
    shell = f"mkdir -p {tmp_path}/cache && " + serve_then_load(f"bash {server}", loader=str(loader), plans_dir=str(tmp_path))
    proc = subprocess.Popen(["bash", "-c", shell], env=dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"))
    try:
        for _ in range(100):
            if (tmp_path / "loaded").exists() and (tmp_path / "started").exists():
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert (tmp_path / "loaded").read_text() == "yes"
        proc.terminate()
        assert proc.wait(timeout=20) == 0
        assert (tmp_path / "signal").read_text().strip() == "stopped"
    finally:
        proc.kill()


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
