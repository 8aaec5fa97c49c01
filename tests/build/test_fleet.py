"""``build --fleet``: many models into one repository, one failure never stopping the others; the Indexed Job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import cli, one_line_error
from tests.triton.s3_fixture import S3Endpoint, monkeypatch_module, s3  # noqa: F401  (fixtures)

FLEET = """
[[model]]
model = "tests.keras_models:sequential"
name = "seq"

[[model]]
model = "tests.keras_models:sequential"
name = "strict"
fp16 = true
fp16-atol = 0.0

[[model]]
model = "tests.keras_models:regression"
name = "reg"
"""


def test_the_k8s_job_runs_one_model_per_index_on_the_gpu_it_serves_on(tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_text(FLEET)
    proc = cli("build", "--fleet", "fleet.toml", "--k8s-job", "job.yaml", "--repository", "s3://models/fleet",
               "--gpu-product", "NVIDIA-H200", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    config_map, job = yaml.safe_load_all((tmp_path / "job.yaml").read_text())
    assert config_map["data"]["fleet.toml"] == FLEET
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["backoffLimitPerIndex"]) == ("Indexed", 3, 1)
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    [container] = pod["containers"]
    assert container["command"][-4:] == ["--fleet-index", "$(FLEET_INDEX)", "--repository", "s3://models/fleet"]
    env = {e["name"]: e["valueFrom"] for e in container["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "triton-s3", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert "job-completion-index" in env["FLEET_INDEX"]["fieldRef"]["fieldPath"]
    validate = Path(sys.executable).parent / "kubernetes-validate"
    run = subprocess.run([str(validate), "--strict", "-k", "1.37.0", str(tmp_path / "job.yaml")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr

    no_engine = cli("build", "--fleet", "fleet.toml", "--k8s-job", "cpu.yaml", "--repository", "s3://models/fleet", "--no-engine", cwd=tmp_path)
    assert no_engine.returncode == 0, no_engine.stderr[-2000:]
    cpu_pod = list(yaml.safe_load_all((tmp_path / "cpu.yaml").read_text()))[1]["spec"]["template"]["spec"]
    assert "nodeSelector" not in cpu_pod and "--no-engine" in cpu_pod["containers"][0]["command"]


@pytest.mark.parametrize(("args", "words"), [
    (["--repository", "s3://models/fleet"], "--gpu-product"),
    (["--repository", "model_repository", "--no-engine"], "s3://BUCKET/PREFIX"),
])
def test_the_k8s_job_needs_a_shared_repository_and_the_gpu_type(args: list[str], words: str, tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_text(FLEET)
    assert words in one_line_error(cli("build", "--fleet", "fleet.toml", "--k8s-job", "job.yaml", *args, cwd=tmp_path))
    assert not (tmp_path / "job.yaml").exists()


def test_a_bad_fleet_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_text('[[model]]\nname = "a"\nfleet-index = 1\n')
    assert "sets fleet_index" in one_line_error(cli("build", "--fleet", "fleet.toml", cwd=tmp_path))
    (tmp_path / "fleet.toml").write_text('[[model]]\nnmae = "a"\n')
    assert "did you mean 'name'" in one_line_error(cli("build", "--fleet", "fleet.toml", cwd=tmp_path))
    assert "need --fleet" in one_line_error(cli("build", "--fleet-index", "0", cwd=tmp_path))


@pytest.mark.slow
def test_one_model_failing_its_gate_never_blocks_the_others(s3: S3Endpoint, tmp_path: Path) -> None:
    """Three small models into one bucket; ``strict`` fails its FP16 gate (an FP16 error of exactly 0 allowed)."""
    (tmp_path / "fleet.toml").write_text(FLEET)
    bucket = s3.bucket()
    proc = cli("build", "--fleet", "fleet.toml", "--workdir", "build", "--repository", f"s3://{bucket}/fleet", cwd=tmp_path, env=dict(s3.env))
    line = one_line_error(proc, status=1)
    assert "1 of 3 fleet models failed: strict" in line
    assert sorted({k.split("/")[1] for k in s3.keys(bucket) if k.endswith("/config.pbtxt")}) == ["reg_fp32", "seq_fp32"]
    for name, status in (("seq", "published"), ("strict", "failed"), ("reg", "published")):
        assert any(name in row and status in row for row in proc.stdout.splitlines()), proc.stdout
    assert "FP16" in proc.stdout + proc.stderr or "fp16" in proc.stdout + proc.stderr
    assert (tmp_path / "build" / "reports" / "index.html").is_file()
