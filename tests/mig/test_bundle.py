"""The deployment bundle: launch script, compose file and Kubernetes manifests agree with the
per-profile configs (same config names, ports, resource names)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig, ModelInstanceGroup

from pipeline.mig.bundle import bundle_files, launch_script
from pipeline.mig.configs import mig_configs_for_repository, write_profile_configs
from pipeline.mig.layout import parse_layout
from pipeline.mig.memory import MemoryEstimate, memory_from_onnx
from pipeline.mig.nvidia_smi import parse_list_gpus
from pipeline.mig.plan import GIB, MigPlan, plan_instances
from pipeline.mig.profiles import builtin_gpu
from pipeline.mig.servers import BundleSettings, k8s_name, mig_resource
from pipeline.triton.config import config_text

from .conftest import NVIDIA_SMI_L_H200

H200 = builtin_gpu("H200-141GB")
LAYOUT = "3x2g.35gb,1x1g.18gb"
RESTRICTED = "model-repository,model-config,shared-memory,trace,logging"


@pytest.fixture
def plan(tiny_onnx: Path) -> MigPlan:
    memory = {
        "tiny_fp32": memory_from_onnx(tiny_onnx, 8),
        # fits 2g.35gb (28.75 GiB for models) once, not 1g.18gb (13.9 GiB)
        "big_fp16_trt": MemoryEstimate("engine metadata (hand-written)", GIB, 20 * GIB),
    }
    return plan_instances(H200, memory, parse_layout(LAYOUT, H200))


def configs_by_model(plan: MigPlan) -> dict[str, set[str]]:
    """Model → the config names it has a configs/<name>.pbtxt for."""
    from pipeline.mig.configs import profile_configs

    out = {}
    for model in plan.memory:
        base = ModelConfig(name=model, platform="onnxruntime_onnx", max_batch_size=8)
        out[model] = {p.removeprefix("configs/").removesuffix(".pbtxt") for p in profile_configs(base, plan)}
    return out


def flag(args: list[str], name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]


def test_launch_script_is_valid_bash_and_matches_the_configs(plan: MigPlan, tmp_path: Path) -> None:
    """Dry run against a hand-written `nvidia-smi -L` (no MIG GPU here)."""
    script = tmp_path / "launch-mig.sh"
    script.write_text(launch_script(plan))
    subprocess.run(["bash", "-n", str(script)], check=True)
    devices = tmp_path / "nvidia-smi-L.txt"
    devices.write_text(NVIDIA_SMI_L_H200)
    env = {**os.environ, "MIG_DEVICES_FILE": str(devices), "TRITON_ADMIN_KEY": "s3cret", "MODEL_REPOSITORY": "/srv/repo"}
    env.pop("TRITON_BIND_ADDRESS", None)
    out = subprocess.run(["bash", str(script), "--dry-run"], env=env, check=True, capture_output=True, text=True).stdout
    lines = out.strip().splitlines()
    listed = parse_list_gpus(NVIDIA_SMI_L_H200)[0].mig_devices
    assert len(lines) == len(listed) == 4
    configs = configs_by_model(plan)
    seen_ports: set[str] = set()
    for line, device in zip(lines, listed):
        env_part, *args = line.split()
        assert env_part == f"CUDA_VISIBLE_DEVICES={device.uuid}"
        assert args[0] == "tritonserver"
        (name,) = flag(args, "model-config-name")
        assert name == device.profile
        loaded = flag(args, "load-model")
        assert "--model-control-mode=explicit" in args
        # explicit model control means load/unload over the API: the admin APIs must need the key
        assert flag(args, "http-restricted-api") == ["model-repository,model-config,shared-memory,trace,logging:admin-key=s3cret"]
        assert loaded == list(plan.profile(device.profile).loaded)
        assert all(name in configs[m] for m in loaded)  # every loaded model has configs/<name>.pbtxt
        ports = flag(args, "http-port") + flag(args, "grpc-port") + flag(args, "metrics-port")
        assert not seen_ports & set(ports)
        seen_ports |= set(ports)
    assert "big_fp16_trt" not in lines[3] and "big_fp16_trt" in lines[0]  # too large for 1g.18gb
    assert flag(lines[1].split(), "http-port") == ["8010"]
    assert flag(lines[1].split(), "http-address") == ["127.0.0.1"]  # TRITON_BIND_ADDRESS unset: loopback


def test_launch_script_skips_unplanned_profiles_and_fails_without_devices(plan: MigPlan, tmp_path: Path) -> None:
    script = tmp_path / "launch-mig.sh"
    script.write_text(launch_script(plan))
    devices = tmp_path / "L.txt"
    devices.write_text("GPU 0: NVIDIA H200 (UUID: GPU-1)\n  MIG 7g.141gb     Device  0: (UUID: MIG-abc)\n")
    run = subprocess.run(["bash", str(script), "--dry-run"], env={**os.environ, "MIG_DEVICES_FILE": str(devices), "TRITON_ADMIN_KEY": "k", "MODEL_REPOSITORY": "/srv/repo"},
                         capture_output=True, text=True, check=False)
    assert run.returncode == 1
    assert "no model is planned for MIG profile 7g.141gb" in run.stderr
    assert "no MIG device with a planned profile" in run.stderr


def compose_args(service: dict) -> list[str]:
    """The tritonserver arguments of a compose service (``bash -c "<cache setup> && exec tritonserver ..."``)."""
    bash, dash_c, command = service["command"]
    assert (bash, dash_c) == ("bash", "-c")
    setup, _, server = command.replace("$$", "$").partition(" && exec ")  # compose turns "$$" into "$"
    loaded = [a.split("=", 1)[1] for a in shlex.split(server) if a.startswith("--load-model=")]
    # the container's own /tmp: emptied, then every loaded model's engine cache directory made
    dirs = " ".join(f"/tmp/trt-engine-cache-{m}" for m in sorted(loaded))
    assert setup == f"rm -rf {dirs} && mkdir -p {dirs}"
    return shlex.split(server)


def test_compose_file(plan: MigPlan) -> None:
    compose = yaml.safe_load(bundle_files(plan, BundleSettings(repository="../model_repository"))["docker-compose.yml"])
    services = compose["services"]
    assert list(services) == ["triton-0-2g-35gb", "triton-1-2g-35gb", "triton-2-2g-35gb", "triton-3-1g-18gb"]
    configs = configs_by_model(plan)
    host_ports = []
    for slot, service in enumerate(services.values()):
        command = compose_args(service)
        (name,) = flag(command, "model-config-name")
        assert all(name in configs[m] for m in flag(command, "load-model"))
        device = service["deploy"]["resources"]["reservations"]["devices"][0]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert device["device_ids"][0].startswith(f"${{MIG_UUID_{slot}:?")
        assert all(p.startswith("${TRITON_BIND_ADDRESS:-127.0.0.1}:") for p in service["ports"])  # loopback by default
        host_ports += [p.split(":")[-2] for p in service["ports"]]
        assert [p.split(":")[-1] for p in service["ports"]] == ["8000", "8001", "8002"]
        assert flag(command, "http-port") == ["8000"]
        # as deploy's compose file: non-root, init, repository relative to the bundle, key only in the environment
        assert (service["user"], service["init"]) == ("triton-server", True)
        assert service["volumes"] == [{"type": "bind", "source": "../model_repository", "target": "/models", "read_only": True}]
        assert service["environment"] == {"TRITON_ADMIN_KEY": "${TRITON_ADMIN_KEY:?export TRITON_ADMIN_KEY=<secret> first}"}
        assert "${TRITON_ADMIN_KEY" not in service["command"][2].replace("$${TRITON_ADMIN_KEY}", "")
        assert flag(command, "http-restricted-api") == [f"{RESTRICTED}:admin-key=${{TRITON_ADMIN_KEY}}"]
    assert len(host_ports) == len(set(host_ports)) == 12


def test_compose_without_a_repository_requires_model_repository(plan: MigPlan) -> None:
    service = next(iter(yaml.safe_load(bundle_files(plan)["docker-compose.yml"])["services"].values()))
    assert service["volumes"][0]["source"] == "${MODEL_REPOSITORY:?set MODEL_REPOSITORY to the model repository}"


def test_compose_uses_uuids_from_nvidia_smi_l(plan: MigPlan) -> None:
    devices = list(parse_list_gpus(NVIDIA_SMI_L_H200)[0].mig_devices)
    compose = yaml.safe_load(bundle_files(plan, devices=devices)["docker-compose.yml"])
    ids = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"][0] for s in compose["services"].values()]
    assert ids == [d.uuid for d in devices]


def test_kubernetes_manifests(plan: MigPlan) -> None:
    files = bundle_files(plan, BundleSettings(image="registry.example/tritonserver:test"))
    manifests = {k: list(yaml.safe_load_all(v)) for k, v in files.items() if k.startswith("k8s/triton-mig-")}
    assert sorted(manifests) == ["k8s/triton-mig-1g-18gb.yaml", "k8s/triton-mig-2g-35gb.yaml"]
    configs = configs_by_model(plan)
    for path, (deployment, service) in manifests.items():
        assert (deployment["apiVersion"], deployment["kind"]) == ("apps/v1", "Deployment")
        assert (service["apiVersion"], service["kind"]) == ("v1", "Service")
        labels = deployment["spec"]["selector"]["matchLabels"]
        assert deployment["spec"]["template"]["metadata"]["labels"] == labels == service["spec"]["selector"]
        profile = "1g.18gb" if "1g" in path else "2g.35gb"
        assert deployment["metadata"]["name"] == service["metadata"]["name"] == f"triton-mig-{k8s_name(profile)}"
        assert deployment["spec"]["replicas"] == plan.profile(profile).devices
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "registry.example/tritonserver:test"
        resources = container["resources"]
        assert resources["limits"][f"nvidia.com/mig-{profile}"] == resources["requests"][f"nvidia.com/mig-{profile}"] == 1
        assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
        (name,) = flag(container["args"], "model-config-name")
        assert name == profile
        assert set(flag(container["args"], "load-model")) == {m for m, names in configs.items() if name in names}
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
        assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
        assert int(flag(container["args"], "http-port")[0]) == ports["http"]
        assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
        assert flag(container["args"], "http-restricted-api") == [f"{RESTRICTED}:admin-key=$(TRITON_ADMIN_KEY)"]
        volumes = {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert {m["name"] for m in container["volumeMounts"]} <= volumes


def test_media_extension_resource_name() -> None:
    """The device plugin spells +me profiles with a dot (GPU Operator: mig-1g.10gb.me)."""
    assert mig_resource("1g.18gb+me") == "nvidia.com/mig-1g.18gb.me"
    assert k8s_name("1g.18gb+me") == "1g-18gb-me"


def _free_base(count: int, stride: int) -> int:
    """A base port with base + i*stride + {0,1,2} free on 127.0.0.1 for i < count."""
    for base in range(28400, 60000, 97):
        ports = [base + i * stride + k for i in range(count) for k in range(3)]
        try:
            for port in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free ports")


def _get(url: str, admin_key: str | None = None) -> bytes | None:
    """The body of a 200 answer, or None while the server is not (yet) answering."""
    request = urllib.request.Request(url, headers={"admin-key": admin_key} if admin_key else {})
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=2) as response:
            return response.read()
    except OSError:
        return None


@pytest.mark.slow
def test_launch_script_starts_real_tritonservers_with_profile_configs(tmp_path: Path) -> None:
    """The generated launch script runs the real tritonserver (pytriton's, python backend) once per
    MIG device of a hand-written `nvidia-smi -L`; each server must load configs/<profile>.pbtxt,
    including the '.' and '+' in 1g.18gb+me. No GPU here: the generated KIND_GPU instance groups
    are switched to KIND_CPU in the written files, and CUDA_VISIBLE_DEVICES holds a fake UUID. The
    servers start one after the other (the script waits for each to answer ready: STAGGER=1)."""
    spec = find_spec("pytriton")
    assert spec is not None and spec.submodule_search_locations
    pytriton = Path(next(iter(spec.submodule_search_locations)))
    binary = pytriton / "tritonserver" / "bin" / "tritonserver"
    if not binary.is_file():
        pytest.skip(f"no tritonserver binary at {binary}")
    backends = tmp_path / "backends"
    shutil.copytree(pytriton / "tritonserver" / "backends", backends)
    # The stub embeds Python: the one built for this interpreter's version, as TritonServer picks it.
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = pytriton / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"
    assert stub.is_file(), f"nvidia-pytriton ships no Python backend stub for Python {version}"
    shutil.copy(stub, backends / "python" / "triton_python_backend_stub")

    repo = tmp_path / "repo"
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "1" / "model.py").write_text(
        "import triton_python_backend_utils as pb\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        return [pb.InferenceResponse([pb.Tensor('y', pb.get_input_tensor_by_name(r, 'x').as_numpy())])"
        " for r in requests]\n"
    )
    base = ModelConfig(name="echo", backend="python", max_batch_size=8)
    base.input.add(name="x", data_type=DataType.TYPE_FP32, dims=[4])
    base.output.add(name="y", data_type=DataType.TYPE_FP32, dims=[4])
    # count 3 in config.pbtxt: a server that fell back to it instead of configs/<profile>.pbtxt shows
    base.instance_group.add(kind=ModelInstanceGroup.Kind.KIND_CPU, count=3)
    (repo / "echo" / "config.pbtxt").write_text(config_text(base))
    # 12 GiB per instance: 2 on a 2g.35gb (28.75 GiB for models), 1 on a 1g.18gb+me (13.9 GiB)
    plan, files = mig_configs_for_repository({"echo": base}, "H200-141GB", "1x2g.35gb,1x1g.18gb+me",
                                             {"echo": MemoryEstimate("test", 0, 12 * GIB)})
    assert plan.profile("2g.35gb").instances("echo") == 2 and plan.profile("1g.18gb+me").instances("echo") == 1
    cpu_files = {}
    for relpath, text in files["echo"].items():
        config = text_format.Parse(text, ModelConfig())
        config.instance_group[0].kind = ModelInstanceGroup.Kind.KIND_CPU  # no GPU on this machine
        cpu_files[relpath] = config_text(config)
    write_profile_configs(repo / "echo", cpu_files)

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "launch-mig.sh").write_text(bundle_files(plan)["launch-mig.sh"])
    wrapper = tmp_path / "tritonserver"
    venv_bin = Path(os.sys.executable).parent
    # This test's servers' Python-backend segments get a prefix of their own: other tests' servers may run
    # beside it (pytest -n 2) and must not count as its leaks.
    shm_prefix = f"launchtest_{uuid.uuid4().hex[:12]}_"
    wrapper.write_text(
        "#!/usr/bin/env bash\n"
        f"export LD_LIBRARY_PATH={pytriton.parent / 'nvidia_pytriton.libs'}:${{LD_LIBRARY_PATH:-}}\n"
        f"export PATH={venv_bin}:$PATH\n"
        f'exec {binary} "$@" --backend-directory={backends} --http-address=127.0.0.1 '
        f"--grpc-address=127.0.0.1 --metrics-address=127.0.0.1 --backend-config=python,shm-region-prefix-name={shm_prefix}\n"
    )
    wrapper.chmod(0o755)
    devices = tmp_path / "nvidia-smi-L.txt"
    devices.write_text(
        "GPU 0: NVIDIA H200 (UUID: GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901)\n"
        "  MIG 2g.35gb      Device  0: (UUID: MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c4d)\n"
        "  MIG 1g.18gb+me   Device  1: (UUID: MIG-1b2c3d4e-5f6a-5b7c-9d8e-0f1a2b3c4d5e)\n"
    )
    base_port = _free_base(2, 10)
    env = {
        **os.environ,
        "MIG_DEVICES_FILE": str(devices),
        "MODEL_REPOSITORY": str(repo),
        "TRITONSERVER": str(wrapper),
        "HTTP_BASE": str(base_port),
        "GRPC_BASE": str(base_port + 1),
        "METRICS_BASE": str(base_port + 2),
        "TRITON_ADMIN_KEY": "s3cret",
    }
    shm_before = set(os.listdir("/dev/shm"))
    log = (tmp_path / "servers.log").open("w")
    proc = subprocess.Popen(["bash", str(bundle / "launch-mig.sh")], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        expected = {base_port: 2, base_port + 10: 1}
        found: dict[int, int] = {}
        deadline = time.monotonic() + 240  # a guard against a hang: the servers start one after the other (STAGGER=1)
        while time.monotonic() < deadline and len(found) < len(expected) and proc.poll() is None:
            for port in expected:
                config = _get(f"http://127.0.0.1:{port}/v2/models/echo/config", admin_key="s3cret")  # model-config is restricted
                if config and _get(f"http://127.0.0.1:{port}/v2/models/echo/ready") is not None:
                    found[port] = sum(g["count"] for g in json.loads(config)["instance_group"])
            time.sleep(0.5)
        assert found == expected, (tmp_path / "servers.log").read_text()[-3000:]
        # made before the servers started (they share the host's /tmp; ONNX Runtime only creates the leaf, racily)
        assert Path("/tmp/trt-engine-cache-echo").is_dir()
        request = urllib.request.Request(f"http://127.0.0.1:{base_port}/v2/repository/index", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5)
        assert denied.value.code == 403  # the repository (load/unload) API needs the admin key
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # any server the script's trap missed
        except ProcessLookupError:
            pass
        log.close()
    assert proc.returncode is not None
    leaked = {n for n in set(os.listdir("/dev/shm")) - shm_before if n.startswith(shm_prefix)}
    assert not leaked, f"the servers left shared memory behind: {sorted(leaked)}"


def test_the_bundle_image_is_checked_against_the_ngc_release_table(plan: MigPlan, tiny_onnx: Path, tmp_path: Path) -> None:
    """As deploy: a tag older than the configs need is refused in one line; a listed one loads the planned models."""
    from pipeline.core.errors import PipelineError
    from pipeline.data.artifacts import Artifact
    from pipeline.data.tensors import signature_from_onnx
    from pipeline.mig.bundle import write_bundle
    from pipeline.triton.config import model_config_from_artifact
    from pipeline.triton.repository import publish_repository

    repo = tmp_path / "model_repository"
    artifact = Artifact("fp32", "onnx", tiny_onnx)
    cfg = model_config_from_artifact(artifact, name="tiny_fp32", signature=signature_from_onnx(tiny_onnx), max_batch=8)
    publish_repository([artifact], model="tiny", repository=repo, configs={"tiny_fp32": cfg}, extra_files={},
                       version_policy="new", report={}, reproduce="test")
    with pytest.raises(PipelineError, match=r"24.03-py3 is older than 24.10"):
        write_bundle(tmp_path / "old", plan, BundleSettings(image="nvcr.io/nvidia/tritonserver:24.03-py3"), repository=repo)
    assert write_bundle(tmp_path / "ok", plan, BundleSettings(image="nvcr.io/nvidia/tritonserver:25.03-py3"), repository=repo)


def test_raw_input_ensemble_rides_with_its_variant(plan: MigPlan) -> None:
    """A raw-input ensemble and its CPU step take no slice: each server loads them where it loads their variant, started in
    the repository's folder (the ensemble's custom-op library is named relative to it); servers without it are unchanged."""
    from pipeline.mig.plan import with_riders

    anchor = plan.profiles[0].loaded[0]
    ridden = with_riders(plan, {"digits": anchor, "digits_preprocess": anchor})
    for before, after in zip(plan.profiles, ridden.profiles, strict=True):
        expected = ("digits", "digits_preprocess") if anchor in before.loaded else ()
        assert after.loaded == before.loaded + expected
    files = bundle_files(ridden)
    script = files["launch-mig.sh"]
    assert 'cd "$MODEL_REPOSITORY" && CUDA_VISIBLE_DEVICES="$uuid" exec' in script and "--load-model=digits_preprocess" in script
    assert 'cd "$MODEL_REPOSITORY"' not in bundle_files(plan)["launch-mig.sh"]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    compose = yaml.safe_load(files["docker-compose.yml"])
    shells = [" ".join(s["command"]) if isinstance(s["command"], list) else s["command"] for s in compose["services"].values()]
    assert all("cd /models && " in shell for shell in shells)
    documents = [d for name, text in files.items() if name.startswith("k8s/") and name.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    containers = [c for d in documents if d.get("kind") == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]]
    ridden_profiles = {p.profile.name for p in ridden.profiles if "digits" in p.loaded}
    assert containers and all(c.get("workingDir") == "/models" for c in containers if any("--load-model=digits" == a for a in c["args"]))
    assert ridden_profiles
