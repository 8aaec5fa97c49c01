"""The production deploy bundle: real files, real YAML, real bash.

Docker is not installed here, so the generated script runs against a stub ``docker`` (and the
container command against a stub ``tritonserver``) that print their arguments; the real tritonserver
2.51 binary is then started with the same generated command line. The engine-cache setup the
container runs first is run for real too, against a cache root under the test's temporary folder
(the only substitution: the root is ``/tmp`` inside the container, shared by the whole host here).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import onnx
import pytest
import yaml
from publish_harness import publish_two, two_io_onnx

from pipeline.commands.deploy import register
from pipeline.core.errors import PipelineError
from pipeline.data.artifacts import Artifact
from pipeline.data.tensors import signature_from_onnx
from pipeline.triton.accelerators import TRT_CACHE_PREFIX, gpu_accelerator_parameters
from pipeline.triton.config import model_config_from_artifact, parse_config
from pipeline.triton.deploy import DEFAULT_IMAGE, server_args, write_deploy_bundle
from pipeline.triton.ngc_releases import ONNXRUNTIME_LIMITS, OPTIONAL_FIELDS, RELEASES, ModelNeeds, NgcRelease, check_image
from pipeline.triton.repository import publish_repository
from pipeline.triton.server_args import shell_command, tritonserver_args

RESTRICTED = "model-repository,model-config,shared-memory,trace,logging"
BIND = "${TRITON_BIND_ADDRESS:-127.0.0.1}"  # where a bundle publishes its ports: loopback by default
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback never goes through a proxy


GPU_MODELS = ["digits_fp16", "digits_fp32"]


def add_cpu_variant(onnx_path: Path, repo: Path) -> None:
    """Publish ``onnx_path`` as the CPU-only ``digits_int8cpu`` variant (KIND_CPU, as a build does)."""
    artifact = Artifact("int8cpu", "onnx", onnx_path)
    cfg = model_config_from_artifact(artifact, name="digits_int8cpu", signature=signature_from_onnx(onnx_path), max_batch=8)
    publish_repository([artifact], model="digits", repository=repo, configs={"digits_int8cpu": cfg}, extra_files={},
                       version_policy="new", report={}, reproduce="python -m pipeline build --name digits")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("deploy")
    repo = root / "model_repository"
    onnx_path = two_io_onnx(root / "two_io.onnx")
    publish_two(onnx_path, repo, "new")
    add_cpu_variant(onnx_path, repo)
    return repo


def split_setup(command: str) -> tuple[str, str]:
    """(engine-cache setup, tritonserver command) of a container command ``<setup> && exec tritonserver ...``."""
    setup, _, server = command.partition(" && exec ")
    assert server, command
    return setup, server


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
    assert service["ports"] == [f"{BIND}:{p}:{p}" for p in (9000, 9001, 9002)]  # loopback unless the operator says
    volume = service["volumes"][0]
    assert (volume["type"], volume["target"], volume["read_only"]) == ("bind", "/models", True)
    assert volume["source"].startswith("../")  # relative to compose.yaml: bundle and repository move together
    assert (compose_path.parent / service["volumes"][0]["source"]).resolve() == repository.resolve()
    assert service["environment"] == {"TRITON_ADMIN_KEY": "${TRITON_ADMIN_KEY:?export TRITON_ADMIN_KEY=<secret> first}"}
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert (service["user"], service["init"]) == ("triton-server", True)
    bash, dash_c, command = service["command"]
    assert (bash, dash_c) == ("bash", "-c")
    setup, server = split_setup(command.replace("$$", "$"))  # compose turns "$$" into "$"
    dirs = " ".join(f"{TRT_CACHE_PREFIX}{m}" for m in GPU_MODELS)
    assert setup == f"rm -rf {dirs} && mkdir -p {dirs}"
    args = shlex.split(server)
    for flag in ("--http-port=9000", "--grpc-port=9001", "--metrics-port=9002", "--model-repository=/models", "--model-control-mode=explicit", "--strict-readiness=true"):
        assert flag in args
    # A GPU host loads the GPU variants only; the CPU-only variant keeps its KIND_CPU config for CPU deployments.
    assert [a for a in args if a.startswith("--load-model=")] == [f"--load-model={m}" for m in GPU_MODELS]
    assert "KIND_CPU" in (repository / "digits_int8cpu" / "config.pbtxt").read_text()
    assert "digits_int8cpu" in (compose_path.parent / "README.md").read_text()  # said, not loaded
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
    assert [["-p", f"127.0.0.1:{p}:{p}"] for p in (8000, 8001, 8002)] == [docker_args[i:i + 2] for i, a in enumerate(docker_args) if a == "-p"]
    assert secret not in script.read_text() and secret not in ran.stdout  # expanded only inside the container
    exposed = subprocess.run(["bash", str(script)], env={**env, "TRITON_ADMIN_KEY": secret, "TRITON_BIND_ADDRESS": "0.0.0.0"},
                             check=True, capture_output=True, text=True, cwd="/").stdout.splitlines()
    assert ["-p", "0.0.0.0:8000:8000"] == exposed[exposed.index("-p"):][:2]  # only when the operator says so
    image_at = docker_args.index(DEFAULT_IMAGE)
    assert docker_args[image_at + 1:image_at + 3] == ["bash", "-c"]

    # What the container's shell then runs, with the key from its environment.
    stub(bin_dir, "tritonserver")
    setup, server = split_setup(docker_args[image_at + 3])
    assert setup.startswith(f"rm -rf {TRT_CACHE_PREFIX}")
    inner = subprocess.run(["bash", "-c", "exec " + server], env={**env, "TRITON_ADMIN_KEY": secret}, check=False, capture_output=True, text=True)
    received = inner.stdout.splitlines()
    assert received == [a.replace("${TRITON_ADMIN_KEY}", secret) for a in tritonserver_args(server_args(models=tuple(GPU_MODELS)))[1:]]
    assert f"--http-restricted-api={RESTRICTED}:admin-key={secret}" in received
    assert f"--grpc-restricted-protocol={RESTRICTED}:admin-key={secret}" in received
    assert {"--http-port=8000", "--grpc-port=8001", "--metrics-port=8002", "--disable-auto-complete-config"} <= set(received)
    assert "--http-address=0.0.0.0" in received  # the container's interfaces; the host publishes on loopback


def _free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


def _status(url: str, headers: dict[str, str] | None = None, data: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with _DIRECT.open(request, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.mark.slow
def test_the_real_tritonserver_starts_with_the_bundle_flags(tmp_path: Path) -> None:
    """The bundle's command line, run through bash as the container runs it, starts the real
    tritonserver 2.51 (on an empty repository, free loopback ports): every flag is accepted, the
    server becomes ready, and the admin APIs answer only with the key from the environment."""
    from pytriton.utils.distribution import get_libs_path, get_root_module_path

    binary = get_root_module_path() / "tritonserver" / "bin" / "tritonserver"
    http, grpc, metrics = _free_ports(3)
    repo = tmp_path / "empty_repository"
    repo.mkdir()
    # Only what differs on this machine: the binary, the repository path, loopback and free ports.
    local = replace(server_args(http, grpc, metrics), repository=str(repo), host="127.0.0.1", binary=str(binary))
    assert [a.split("=", 1)[0] for a in tritonserver_args(local)[1:]] == \
        [a.split("=", 1)[0] for a in tritonserver_args(server_args())[1:]]
    secret = "k3y-from-env"
    env = {**os.environ, "LD_LIBRARY_PATH": str(get_libs_path()), "TRITON_ADMIN_KEY": secret}
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(["bash", "-c", "exec " + shell_command(tritonserver_args(local))], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + 120
        while _status(f"{base}/v2/health/ready") != 200:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
            time.sleep(0.2)
        assert _status(f"{base}/v2/repository/index", data=b"{}") == 403
        assert _status(f"{base}/v2/repository/index", headers={"admin-key": "wrong"}, data=b"{}") == 403
        assert _status(f"{base}/v2/repository/index", headers={"admin-key": secret}, data=b"{}") == 200
        assert _status(f"http://127.0.0.1:{metrics}/metrics") == 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_the_container_setup_empties_the_cache_and_creates_every_models_directory(repository: Path, tmp_path: Path) -> None:
    """The generated setup, run by bash twice as two container starts would: ONNX Runtime's TensorRT EP
    only creates the leaf directory and races between parallel instances (accelerators.py), so every
    model's directory must exist before tritonserver starts; a stale engine from a previous start must go."""
    command = yaml.safe_load(write_deploy_bundle(repository, tmp_path / "deploy")[1].read_text())["services"]["triton"]["command"][2]
    setup, _ = split_setup(command.replace("$$", "$"))
    # The published configs' cache paths are one level under /tmp, which exists in every image: ONNX Runtime
    # creates only the leaf, so a config loads even where no bundle prepared the directory.
    for model in GPU_MODELS:
        cfg = parse_config((repository / model / "config.pbtxt").read_text())
        path = gpu_accelerator_parameters(cfg, "tensorrt")["trt_engine_cache_path"]  # type: ignore[index]
        assert Path(path).parent == Path("/tmp") and f"{TRT_CACHE_PREFIX}{model}" in setup
    tmp = tmp_path / "container-tmp"  # the container's /tmp
    tmp.mkdir()
    here = setup.replace(TRT_CACHE_PREFIX, f"{tmp}/trt-engine-cache-")
    assert here != setup
    subprocess.run(["bash", "-c", here], check=True)
    assert sorted(p.name for p in tmp.iterdir()) == [f"trt-engine-cache-{m}" for m in GPU_MODELS]
    (tmp / "trt-engine-cache-digits_fp32" / "TRTKernel_graph_main_123_sm90.engine").write_bytes(b"old version")
    subprocess.run(["bash", "-c", here], check=True)
    assert sorted(p.name for p in tmp.iterdir()) == [f"trt-engine-cache-{m}" for m in GPU_MODELS]
    assert not any((tmp / "trt-engine-cache-digits_fp32").iterdir())


def _too_new(tmp_path: Path, ir_version: int) -> Path:
    repo = tmp_path / f"ir{ir_version}"
    publish_two(two_io_onnx(tmp_path / "m.onnx"), repo, "new")
    for name in GPU_MODELS:
        model_file = repo / name / "1" / "model.onnx"
        proto = onnx.load(str(model_file))
        proto.ir_version = ir_version
        onnx.save(proto, str(model_file))
    return repo


def test_each_release_in_the_table_checks_ir_version_and_opset(tmp_path: Path) -> None:
    """IR 11 needs ONNX Runtime 1.23 (25.08 on; 1.22 was measured to stop at IR 10): 24.10 refuses and
    names the oldest tag that loads it."""
    repo = _too_new(tmp_path, 11)
    with pytest.raises(PipelineError, match=r"has ONNX IR version 11 and opset 17, but .*24.10-py3 \(ONNX Runtime 1.19.2\) "
                                            r"loads at most IR 10 / opset 21.*use nvcr.io/nvidia/tritonserver:25.08-py3 or newer"):
        write_deploy_bundle(repo, tmp_path / "out")
    with pytest.raises(PipelineError, match=r"25.07-py3 \(ONNX Runtime 1.22.0\) loads at most IR 10 / opset 22"):
        write_deploy_bundle(repo, tmp_path / "out", image="nvcr.io/nvidia/tritonserver:25.07-py3")
    assert write_deploy_bundle(repo, tmp_path / "out", image="nvcr.io/nvidia/tritonserver:25.08-py3")


def test_every_release_field_is_known_or_listed_as_unknown() -> None:
    """No value is missing by accident: each optional field of each row is set or named in
    ``unknown``; ``unverified``/``unknown`` name real fields, never the same one; tags are in order."""
    real = {f for f in OPTIONAL_FIELDS}
    assert real == {"triton", "tensorrt", "cuda", "min_driver", "datacenter_drivers", "max_ir", "max_opset"}
    for release in RELEASES:
        for name in OPTIONAL_FIELDS:
            assert (getattr(release, name) is None) == (name in release.unknown), (release.tag, name)
        assert set(release.unverified) <= real and set(release.unknown) <= real, release.tag
        assert not set(release.unverified) & set(release.unknown), release.tag
        assert release.onnxruntime.split("+")[0] in ONNXRUNTIME_LIMITS, release.tag
    tags = [r.tag for r in RELEASES]
    assert tags == sorted(set(tags))


def _table(*tensorrt: tuple[str, str | None]) -> tuple[NgcRelease, ...]:
    return tuple(NgcRelease(tag, "1.19.2", tensorrt=trt, max_ir=10, max_opset=21) for tag, trt in tensorrt)


def test_a_plan_on_an_image_with_another_tensorrt_names_the_tag_that_runs_its_tensorrt() -> None:
    """The TensorRT column decides (major.minor); the refusal names the newest tag whose TensorRT
    matches. A made-up table: the real one knows only 24.10's TensorRT."""
    table = _table(("24.10", "10.8"), ("24.11", "10.9"), ("24.12", "10.10"), ("25.01", "10.10"), ("25.02", None))
    plan = [ModelNeeds("m", is_plan=True, plan_tensorrt="10.10.0.31")]
    with pytest.raises(PipelineError, match=r"^model m is a TensorRT plan built with TensorRT 10.10.0.31, but "
                                            r"nvcr.io/nvidia/tritonserver:24.10-py3 runs TensorRT 10.8 — pass --image "
                                            r"nvcr.io/nvidia/tritonserver:25.01-py3, which runs TensorRT 10.10; or rebuild the plan with TensorRT 10.8"):
        check_image("nvcr.io/nvidia/tritonserver:24.10-py3", plan, table)
    assert check_image("nvcr.io/nvidia/tritonserver:24.12-py3", plan, table) == []
    with pytest.raises(PipelineError, match=r"no tag in the table is known to run TensorRT 10.13; or rebuild the plan with TensorRT 10.9"):
        check_image("nvcr.io/nvidia/tritonserver:24.11-py3", [ModelNeeds("m", is_plan=True, plan_tensorrt="10.13.2.6")], table)
    with pytest.raises(PipelineError, match=r"the TensorRT of nvcr.io/nvidia/tritonserver:25.02-py3 is not known from a source .* — "
                                            r"pass --image nvcr.io/nvidia/tritonserver:25.01-py3, which runs TensorRT 10.10"):
        check_image("nvcr.io/nvidia/tritonserver:25.02-py3", plan, table)


def test_images_older_than_the_configs_are_refused_and_unknown_ones_say_what_was_not_checked(
    repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(PipelineError, match=r"24.05-py3 is older than 24.10.*use nvcr.io/nvidia/tritonserver:24.10-py3 or newer"):
        write_deploy_bundle(repository, tmp_path / "old", image="nvcr.io/nvidia/tritonserver:24.05-py3")
    with caplog.at_level("WARNING"):
        write_deploy_bundle(repository, tmp_path / "custom", image="registry.example/tritonserver:prod")
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not checked")]
    assert "registry.example/tritonserver:prod is not in the NGC release table" in line and "opset" in line
    caplog.clear()
    with caplog.at_level("WARNING"):
        write_deploy_bundle(repository, tmp_path / "known", image="nvcr.io/nvidia/tritonserver:25.03-py3")
    assert not [r for r in caplog.records if r.getMessage().startswith("not checked")]


def _plan_repository(tmp_path: Path, tensorrt: str | None) -> Path:
    import json

    repo = tmp_path / f"plan_{tensorrt}"
    (repo / "digits_fp16_trt" / "1").mkdir(parents=True)
    (repo / "digits_fp16_trt" / "1" / "model.plan").write_bytes(b"engine")
    (repo / "digits_fp16_trt" / "config.pbtxt").write_text('name: "digits_fp16_trt"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n')
    if tensorrt:
        report = {"versions": {"1": {"engine_metadata": {"tensorrt_version": tensorrt}}}}
        (repo / "digits_fp16_trt" / ".pipeline-report.json").write_text(json.dumps(report))
    return repo


def test_plans_must_match_the_images_tensorrt(tmp_path: Path) -> None:
    """No row of the real table has a sourced TensorRT, so a repository with plans is refused for every tag, saying
    why and naming the same release's TensorRT container; an image outside the table is refused too."""
    with pytest.raises(PipelineError, match="digits_fp16_trt is a TensorRT plan, and a plan only loads on the TensorRT version that built it"):
        write_deploy_bundle(_plan_repository(tmp_path, None), tmp_path / "out")
    with pytest.raises(PipelineError, match=r"built with TensorRT 10.8.0.43, but .*24.10-py3 runs TensorRT 10.5 \(the table's "
                                            r"value, not verified\) — no tag in the table is known to run TensorRT 10.8"):
        write_deploy_bundle(_plan_repository(tmp_path, "10.8.0.43"), tmp_path / "out")
    with pytest.raises(PipelineError, match=r"the table's TensorRT 10.5 for .*24.10-py3 is not verified \(no NVIDIA source for it could be read.*"
                                            r"--plans-at-deploy instead: .*\(nvcr.io/nvidia/tensorrt:24.10-py3\)"):
        write_deploy_bundle(_plan_repository(tmp_path, "10.5.0.18"), tmp_path / "out")
    with pytest.raises(PipelineError, match=r"the TensorRT of nvcr.io/nvidia/tritonserver:25.03-py3 is not known from a source.*"
                                            r"--plans-at-deploy instead: .*\(nvcr.io/nvidia/tensorrt:25.03-py3\)"):
        write_deploy_bundle(_plan_repository(tmp_path, "10.9.0.34"), tmp_path / "later", image="nvcr.io/nvidia/tritonserver:25.03-py3")
    with pytest.raises(PipelineError, match=r"registry.example/tritonserver:prod is not an NGC tritonserver -py3 tag of the release table"):
        write_deploy_bundle(tmp_path / "plan_10.9.0.34", tmp_path / "custom", image="registry.example/tritonserver:prod")


def test_a_repository_of_cpu_only_models_is_not_a_gpu_bundle(tmp_path: Path) -> None:
    repo = tmp_path / "cpu_only"
    add_cpu_variant(two_io_onnx(tmp_path / "m.onnx"), repo)
    with pytest.raises(PipelineError, match="every model in .* is CPU-only"):
        write_deploy_bundle(repo, tmp_path / "out")


def test_bad_ports_and_missing_repository(repository: Path, tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="must be distinct"):
        write_deploy_bundle(repository, tmp_path / "out", http_port=8000, grpc_port=8000)
    with pytest.raises(PipelineError, match=r"model repository .*nothing does not exist"):
        write_deploy_bundle(tmp_path / "nothing", tmp_path / "out")


def test_deploy_command(repository: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="pipeline")
    register(parser.add_subparsers())
    args = parser.parse_args(["deploy", "--repository", str(repository), "--out", str(tmp_path / "bundle"), "--http-port", "8100", "--grpc-port", "8101", "--metrics-port", "8102"])
    assert args.handler(args) == 0
    assert yaml.safe_load((tmp_path / "bundle" / "compose.yaml").read_text())["services"]["triton"]["ports"] == [f"{BIND}:{p}:{p}" for p in (8100, 8101, 8102)]


def test_files_the_user_edited_are_kept_and_the_new_version_goes_beside_them(
    repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "deploy"
    first = write_deploy_bundle(repository, out)
    assert [p.name for p in first] == ["docker-run.sh", "compose.yaml", "README.md"]
    readme, script = out / "README.md", out / "docker-run.sh"
    readme.write_text(readme.read_text() + "\nOur on-call: #ml-serving\n")
    script.write_text(script.read_text().replace("--rm", "--rm --name triton-prod"))
    caplog.clear()
    with caplog.at_level("INFO"):
        second = write_deploy_bundle(repository, out, http_port=9000, grpc_port=9001, metrics_port=9002)
    assert [p.name for p in second] == ["docker-run.sh.new", "compose.yaml", "README.md.new"]
    assert "--name triton-prod" in script.read_text() and "#ml-serving" in readme.read_text()  # kept as edited
    assert ':9000:9000"' in (out / "docker-run.sh.new").read_text() and os.access(out / "docker-run.sh.new", os.X_OK)
    assert "9000:9000" in (out / "compose.yaml").read_text()  # untouched by the user: regenerated in place
    kept = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kept ")]
    assert len(kept) == 2 and all("the new version is" in line for line in kept)
    assert len([r for r in caplog.records if "deploy bundle for" in r.getMessage()]) == 1
    # Once the user takes the new version, regeneration updates it in place again.
    (out / "docker-run.sh.new").replace(script)
    third = write_deploy_bundle(repository, out)
    assert third[0] == script and ':8000:8000"' in script.read_text()


def test_bundle_runs_from_any_directory_with_the_repository_next_to_it(repository: Path, tmp_path: Path) -> None:
    """Relative paths: the bundle written with a relative --out finds the repository from its own folder."""
    bin_dir = tmp_path / "bin"
    stub(bin_dir, "docker")
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(repository, work / "model_repository")
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "deploy", "--repository", "model_repository", "--out", "deploy"],
        cwd=work, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ran = subprocess.run(["bash", "deploy/docker-run.sh"], cwd=work, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "TRITON_ADMIN_KEY": "k"},
                         capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stderr
    args = ran.stdout.splitlines()
    source, target = args[args.index("-v") + 1].rsplit(":", 2)[:2]
    assert (os.path.realpath(source), target) == (str(repository.resolve()), "/models")


def test_older_ngc_images_of_any_flavor_and_the_sdk_image_are_refused() -> None:
    """The month decides what the onnxruntime backend parses, whatever the flavor (trtllm, vllm, igpu …);
    the -py3-sdk image has no tritonserver at all."""
    onnx_model = [ModelNeeds("m", ir_version=8, opset=17)]
    for image in ("nvcr.io/nvidia/tritonserver:24.05-trtllm-python-py3", "nvcr.io/nvidia/tritonserver:24.08-py3-igpu"):
        with pytest.raises(PipelineError, match=r"is older than 24.10.*use nvcr.io/nvidia/tritonserver:24.10-py3 or newer"):
            check_image(image, onnx_model)
    with pytest.raises(PipelineError, match=r"client SDK image: it has no tritonserver.*use nvcr.io/nvidia/tritonserver:25.08-py3"):
        check_image("nvcr.io/nvidia/tritonserver:25.08-py3-sdk", onnx_model)
    [line] = check_image("nvcr.io/nvidia/tritonserver:25.08-vllm-python-py3", onnx_model)
    assert "is not in the NGC release table" in line


def test_a_plan_refused_by_an_image_below_the_engine_stages_tensorrt_is_not_told_to_rebuild_for_it() -> None:
    """24.10 runs TensorRT 10.5, below MIN_TENSORRT (10.8): "rebuild with 10.5" is a fix the build refuses."""
    with pytest.raises(PipelineError, match=r"runs TensorRT 10.5 .* older than 10.8, the oldest the engine stage builds with") as caught:
        check_image("nvcr.io/nvidia/tritonserver:24.10-py3", [ModelNeeds("m", is_plan=True, plan_tensorrt="10.16.1.11")])
    assert "rebuild the plan with TensorRT 10.5" not in str(caught.value)


@pytest.mark.parametrize("image", ["", "nvcr.io/nvidia/tritonserver 24.10-py3", "NVCR.io/nvidia/tritonserver:24.10-py3", "tritonserver:"])
def test_an_image_no_registry_could_serve_is_refused_in_one_line(image: str) -> None:
    with pytest.raises(PipelineError, match=r"is not a container image reference") as caught:
        check_image(image, [ModelNeeds("m", ir_version=8, opset=17)])
    assert caught.value.fix and "nvcr.io/nvidia/tritonserver:24.10-py3" in caught.value.fix


def test_images_before_25_04_warn_about_several_gpus(repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before 25.04 the onnxruntime backend ran every instance's TensorRT EP on GPU 0: the bundle says so and
    names the way out (one container per GPU, or 25.04+); 25.04 says nothing."""
    with caplog.at_level("WARNING"):
        write_deploy_bundle(repository, tmp_path / "old")
    [line] = [r.getMessage() for r in caplog.records if "GPU 0" in r.getMessage()]
    assert "one container per GPU" in line and "nvcr.io/nvidia/tritonserver:25.04-py3 or newer" in line
    assert "GPU 0" in (tmp_path / "old" / "README.md").read_text()
    caplog.clear()
    with caplog.at_level("WARNING"):
        write_deploy_bundle(repository, tmp_path / "new", image="nvcr.io/nvidia/tritonserver:25.04-py3")
    assert not [r for r in caplog.records if "GPU 0" in r.getMessage()]
    assert "GPU 0" not in (tmp_path / "new" / "README.md").read_text()


def test_the_several_gpus_note_is_a_warning_of_deploy_not_of_a_build(repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """24.10's TensorRT EP puts every instance on GPU 0: `deploy` warns; a build writing the bundle beside the repository
    (quiet) says it at info; both bundles carry it in their README."""
    import logging

    with caplog.at_level(logging.INFO, logger="pipeline.triton.deploy"):
        write_deploy_bundle(repository, tmp_path / "deploy")
        write_deploy_bundle(repository, tmp_path / "built", quiet=True)
    notes = [(r.levelno, r.getMessage()) for r in caplog.records if "PR #299" in r.getMessage()]
    assert [level for level, _ in notes] == [logging.WARNING, logging.INFO], notes
    assert all("PR #299" in (tmp_path / d / "README.md").read_text() for d in ("deploy", "built"))
