"""The production deploy bundle: real files, real YAML, real bash.

Docker is not installed here, so the generated script runs against a stub ``docker`` (and the
container command against a stub ``tritonserver``) that print their arguments; the flags are also
checked against the ``--help`` of the real tritonserver 2.51 binary (no server is started).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
from pathlib import Path

import onnx
import pytest
import yaml
from publish_harness import publish_two, two_io_onnx

from pipeline.errors import PipelineError
from pipeline.triton.deploy import (
    DEFAULT_IMAGE,
    RESTRICTED_APIS,
    register,
    tritonserver_args,
    write_deploy_bundle,
)

RESTRICTED = "model-repository,model-config,shared-memory,trace,logging"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("deploy")
    repo = root / "model_repository"
    publish_two(two_io_onnx(root / "two_io.onnx"), repo, "new")
    return repo


def stub(folder: Path, name: str) -> None:
    """An executable that prints each argument on its own line, like the real one would receive them."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/usr/bin/env bash\nprintf '%s\\n' \"$@\"\n")
    path.chmod(0o755)


def test_bundle_files_parse_and_agree_on_ports(repository: Path, tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    paths = write_deploy_bundle(repository, out, http_port=9000, grpc_port=9001, metrics_port=9002)
    assert [p.name for p in paths] == ["docker-run.sh", "compose.yaml", "README.md"]
    script, compose_path = paths[0], paths[1]
    assert subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True).returncode == 0
    assert os.access(script, os.X_OK)

    service = yaml.safe_load(compose_path.read_text())["services"]["triton"]
    assert service["image"] == DEFAULT_IMAGE == "nvcr.io/nvidia/tritonserver:24.10-py3"
    assert service["ports"] == ["9000:9000", "9001:9001", "9002:9002"]
    volume = service["volumes"][0]
    assert (volume["type"], volume["target"], volume["read_only"]) == ("bind", "/models", True)
    assert volume["source"].startswith("../")  # relative to compose.yaml: bundle and repository move together
    assert (compose_path.parent / service["volumes"][0]["source"]).resolve() == repository.resolve()
    assert service["environment"] == {"TRITON_ADMIN_KEY": "${TRITON_ADMIN_KEY:?export TRITON_ADMIN_KEY=<secret> first}"}
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    bash, dash_c, command = service["command"]
    assert (bash, dash_c) == ("bash", "-c")
    args = shlex.split(command.replace("$$", "$"))  # compose turns "$$" into "$"
    for flag in ("--http-port=9000", "--grpc-port=9001", "--metrics-port=9002", "--model-repository=/models", "--model-control-mode=none", "--strict-readiness=true"):
        assert flag in args
    assert f"--http-restricted-api={RESTRICTED}:admin-key=${{TRITON_ADMIN_KEY}}" in args
    assert f"--grpc-restricted-protocol={RESTRICTED}:admin-key=${{TRITON_ADMIN_KEY}}" in args


def test_script_runs_docker_with_the_key_from_the_environment(repository: Path, tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    script = write_deploy_bundle(repository, out)[0]
    bin_dir = tmp_path / "bin"
    stub(bin_dir, "docker")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}

    missing = subprocess.run(["bash", str(script)], env=env, check=False, capture_output=True, text=True)
    assert missing.returncode != 0 and "export TRITON_ADMIN_KEY=<secret> first" in missing.stderr

    secret = "k3y-from-env"
    ran = subprocess.run(["bash", str(script)], env={**env, "TRITON_ADMIN_KEY": secret}, check=False, capture_output=True, text=True, cwd="/")
    assert ran.returncode == 0, ran.stderr
    docker_args = ran.stdout.splitlines()
    assert docker_args[:2] == ["run", "--rm"]
    assert ["--gpus", "all"] == docker_args[docker_args.index("--gpus"):][:2]
    assert ["-v", f"{repository.resolve()}:/models:ro"] == docker_args[docker_args.index("-v"):][:2]
    assert ["-e", "TRITON_ADMIN_KEY"] == docker_args[docker_args.index("-e"):][:2]
    assert [f"-p {p}:{p}".split() for p in (8000, 8001, 8002)] == [docker_args[i:i + 2] for i, a in enumerate(docker_args) if a == "-p"]
    assert secret not in script.read_text() and secret not in ran.stdout  # expanded only inside the container
    image_at = docker_args.index(DEFAULT_IMAGE)
    assert docker_args[image_at + 1:image_at + 3] == ["bash", "-c"]

    # What the container's shell then runs, with the key from its environment.
    stub(bin_dir, "tritonserver")
    inner = subprocess.run(["bash", "-c", docker_args[image_at + 3]], env={**env, "TRITON_ADMIN_KEY": secret}, check=False, capture_output=True, text=True)
    server_args = inner.stdout.splitlines()
    assert server_args == [a.replace("${TRITON_ADMIN_KEY}", secret) for a in tritonserver_args()[1:]]
    assert f"--http-restricted-api={RESTRICTED}:admin-key={secret}" in server_args
    assert f"--grpc-restricted-protocol={RESTRICTED}:admin-key={secret}" in server_args
    assert {"--http-port=8000", "--grpc-port=8001", "--metrics-port=8002", "--disable-auto-complete-config"} <= set(server_args)


def test_flags_exist_in_the_real_tritonserver() -> None:
    """Every flag of the bundle appears in ``tritonserver --help`` of the local 2.51 binary."""
    from pytriton.utils.distribution import get_libs_path, get_root_module_path

    binary = get_root_module_path() / "tritonserver" / "bin" / "tritonserver"
    help_run = subprocess.run([str(binary), "--help"], env={**os.environ, "LD_LIBRARY_PATH": str(get_libs_path())}, check=False, capture_output=True, text=True)
    help_text = help_run.stdout + help_run.stderr
    known = set(re.findall(r"^\s+(--[a-z0-9-]+)", help_text, flags=re.MULTILINE))
    assert len(known) > 50
    used = {arg.split("=", 1)[0] for arg in tritonserver_args()[1:]}
    assert used <= known, used - known
    apis = re.search(r"Allowed APIs: ([a-z, \-\n\t]+)", help_text)
    assert apis is not None
    assert set(RESTRICTED_APIS) <= {a.strip() for a in apis.group(1).split(",")}


def test_default_image_refuses_models_it_cannot_load(repository: Path, tmp_path: Path) -> None:
    too_new = tmp_path / "too_new"
    publish_two(two_io_onnx(tmp_path / "m.onnx"), too_new, "new")
    model_file = too_new / "digits_fp32" / "1" / "model.onnx"
    proto = onnx.load(str(model_file))
    proto.ir_version = 11
    onnx.save(proto, str(model_file))
    with pytest.raises(PipelineError, match="has ONNX IR version 11 and opset 17, but .*24.10-py3 .* loads at most IR 10 / opset 21"):
        write_deploy_bundle(too_new, tmp_path / "out")
    assert write_deploy_bundle(too_new, tmp_path / "out", image="nvcr.io/nvidia/tritonserver:25.10-py3")

    with_plan = tmp_path / "with_plan"
    (with_plan / "digits_fp16_trt" / "1").mkdir(parents=True)
    (with_plan / "digits_fp16_trt" / "1" / "model.plan").write_bytes(b"engine")
    (with_plan / "digits_fp16_trt" / "config.pbtxt").write_text('name: "digits_fp16_trt"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n')
    with pytest.raises(PipelineError, match="digits_fp16_trt is a TensorRT plan, and a plan only loads on the TensorRT version that built it"):
        write_deploy_bundle(with_plan, tmp_path / "out2")


def test_bad_ports_and_missing_repository(repository: Path, tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="must be distinct"):
        write_deploy_bundle(repository, tmp_path / "out", http_port=8000, grpc_port=8000)
    with pytest.raises(PipelineError, match=r"run `python -m pipeline build` first"):
        write_deploy_bundle(tmp_path / "nothing", tmp_path / "out")


def test_deploy_command(repository: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="pipeline")
    register(parser.add_subparsers())
    args = parser.parse_args(["deploy", "--repository", str(repository), "--out", str(tmp_path / "bundle"), "--http-port", "8100", "--grpc-port", "8101", "--metrics-port", "8102"])
    assert args.handler(args) == 0
    assert yaml.safe_load((tmp_path / "bundle" / "compose.yaml").read_text())["services"]["triton"]["ports"] == ["8100:8100", "8101:8101", "8102:8102"]
