"""MIG on CPU, for real: `serve --slices 2` runs two pinned tritonservers and one `loadtest` run with
two --url load-tests both endpoints; `build --mig` writes per-profile configs and a bundle that agree.

No GPU or MIG exists here: the slices are CPU shares, and the per-profile configs are checked as
files (they are loaded by a real tritonserver in tests/mig/test_bundle.py's launch test).
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
from pathlib import Path

import pytest
import yaml

from pipeline.triton.config import parse_config
from tests.conftest import ROOT, Built, cli

pytestmark = pytest.mark.slow
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _free_base_port() -> int:
    """A port p with p..p+5 free (two slices take three ports each)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + 6 < 65535 and all(_free(base + i) for i in range(6)):
            return base
    raise RuntimeError("no six consecutive free ports")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ready(port: int) -> bool:
    try:
        return _DIRECT.open(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status == 200
    except OSError:
        return False


def test_two_slices_serve_and_one_loadtest_covers_both(built: Built, tmp_path: Path) -> None:
    base = _free_base_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    serve = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "serve", "--repository", str(built.repository), "--slices", "2",
         "--http-port", str(base), "--grpc-port", str(base + 1), "--metrics-port", str(base + 2), "--log-file", str(tmp_path / "serve.log")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    ports = [base, base + 3]
    try:
        deadline = time.monotonic() + 120
        while not all(_ready(p) for p in ports):
            assert serve.poll() is None, serve.stdout.read() if serve.stdout else ""
            assert time.monotonic() < deadline, "slices did not become ready"
            time.sleep(0.5)
        report_dir = tmp_path / "reports"
        proc = cli(
            "loadtest", "--url", f"127.0.0.1:{ports[0]}", "--url", f"127.0.0.1:{ports[1]}", "--model", "digits_fp32",
            "--concurrency", "2", "--window-ms", "500", "--max-seconds", "6", "--report-dir", str(report_dir),
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        [results] = list(report_dir.rglob("results.json"))
        data = json.loads(results.read_text())
        [point] = data["points"]
        per_endpoint = {e["endpoint"]: e for e in point["endpoints"]}
        assert set(per_endpoint) == {f"127.0.0.1:{p}" for p in ports}
        for endpoint in per_endpoint.values():
            assert endpoint["requests"] > 0 and not endpoint["errors"]
            assert endpoint["client_successes_total"] == endpoint["server_successes_total"]
        aggregate = point["aggregate"]
        assert aggregate["requests"] == sum(e["requests"] for e in per_endpoint.values())
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0


def test_build_with_mig_writes_per_profile_configs_and_a_consistent_bundle(built: Built, tmp_path: Path) -> None:
    repository, workdir = tmp_path / "model_repository", tmp_path / "build"
    shutil.copytree(built.workdir, workdir, symlinks=True)  # stages stay cached; the shared build is never changed
    proc = cli("build", "--fp16", "--int8", "--mig", "H200-141GB:3x2g.35gb,1x1g.18gb",
               "--workdir", str(workdir), "--repository", str(repository))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for model in ("digits_fp32", "digits_fp16", "digits_int8"):
        configs = {p.stem: parse_config(p.read_text()) for p in (repository / model / "configs").glob("*.pbtxt")}
        assert set(configs) == {"2g.35gb", "1g.18gb"}, model
        for profile, cfg in configs.items():
            assert cfg.name == model and cfg.instance_group[0].count >= 1
            assert cfg.instance_group[0].kind == cfg.instance_group[0].KIND_GPU
        assert configs["2g.35gb"].instance_group[0].count >= configs["1g.18gb"].instance_group[0].count
    bundle = tmp_path / "deploy" / "mig"
    script = (bundle / "launch-mig.sh").read_text()
    assert subprocess.run(["bash", "-n", str(bundle / "launch-mig.sh")]).returncode == 0
    assert "--model-config-name" in script
    resources = set()
    for manifest in (bundle / "k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(manifest.read_text()):
            if doc and doc["kind"] == "Deployment":
                [container] = doc["spec"]["template"]["spec"]["containers"]
                resources |= {k for k in container["resources"]["limits"] if k.startswith("nvidia.com/mig-")}
                names = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--model-config-name=")]
                assert names and all((repository / "digits_fp32" / "configs" / f"{n}.pbtxt").exists() for n in names)
    assert resources == {"nvidia.com/mig-2g.35gb", "nvidia.com/mig-1g.18gb"}


def test_default_model_instances_per_h200_profile_from_the_recorded_lgip(built: Built, fixtures_dir: Path) -> None:
    """The digits CNN (weights ~110 KiB, activations ~2 MiB at batch 64) fits everywhere, so the SM
    heuristic (≤ SMs // 8) decides: the counts below follow from the fixture's SM column."""
    from pipeline.mig.memory import memory_from_onnx
    from pipeline.mig.nvidia_smi import gpu_from_lgip, parse_lgip
    from pipeline.mig.plan import plan_instances

    gpu = gpu_from_lgip(parse_lgip((fixtures_dir / "nvidia-smi-mig-lgip-h200.txt").read_text()), "H200-141GB")
    onnx_path = built.repository / "digits_fp32" / "1" / "model.onnx"
    plan = plan_instances(gpu, {"digits_fp32": memory_from_onnx(onnx_path, 64)})
    counts = {p.profile.name: p.instances("digits_fp32") for p in plan.profiles}
    assert counts == {"1g.18gb": 2, "1g.18gb+me": 2, "1g.35gb": 3, "2g.35gb": 4, "3g.71gb": 7, "4g.71gb": 8, "7g.141gb": 16}
    assert not plan.exclusions
