"""Every generated Kubernetes manifest validates offline against the Kubernetes API schemas
(``kubernetes-validate``, strict: unknown fields fail), through its Python API and its command line
on the written files. ServiceMonitor and InferenceService are custom resources the validator has no
schema for: the API raises SchemaNotFoundError and the command line only warns ("Couldn't find
schema") and exits 0, so it would pass anything. Their CRD schemas are not available offline here,
so instead: the InferenceService's pod parts (init container, volumes, security context, and the
model container with KServe's own keys removed) are validated strictly as a core/v1 Pod, and the
remaining fields of both are checked one by one against the Prometheus Operator and KServe v1beta1
APIs. The compose files are not Kubernetes objects (tests/mig/test_bundle.py checks them)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pipeline.mig.bundle import bundle_files
from pipeline.mig.bundle import write_bundle
from pipeline.mig.k8s import ADAPTER_RULE, KSERVE_RUNTIME, QUEUE_METRIC, startup_budget_s
from pipeline.mig.layout import parse_layout
from pipeline.mig.memory import MemoryEstimate, memory_from_onnx
from pipeline.mig.plan import GIB, MigPlan, plan_instances
from pipeline.mig.profiles import builtin_gpu
from pipeline.mig.servers import BundleSettings, mig_resource

K8S_VERSION = "1.37.0"
CUSTOM = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("serving.kserve.io/v1beta1", "InferenceService")}


@pytest.fixture
def plan(tiny_onnx: Path) -> MigPlan:
    h200 = builtin_gpu("H200-141GB")
    memory = {"tiny_fp32": memory_from_onnx(tiny_onnx, 8), "big": MemoryEstimate("hand-written", GIB, 20 * GIB)}
    return plan_instances(h200, memory, parse_layout("3x2g.35gb,1x1g.18gb+me", h200))


def documents(plan: MigPlan, settings: BundleSettings = BundleSettings()) -> dict[str, list[dict]]:
    files = bundle_files(plan, settings)
    return {path: [d for d in yaml.safe_load_all(text) if d] for path, text in files.items() if path.startswith("k8s/") and path.endswith(".yaml")}


def test_every_builtin_kind_validates_against_the_kubernetes_schemas(plan: MigPlan) -> None:
    kinds = set()
    for path, docs in documents(plan).items():
        for doc in docs:
            kinds.add(doc["kind"])
            if (doc["apiVersion"], doc["kind"]) in CUSTOM:
                with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
                continue
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises ValidationError naming the field
    assert kinds == {"Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap", "ServiceMonitor", "InferenceService"}


def test_the_validator_catches_a_broken_manifest(plan: MigPlan) -> None:
    deployment = documents(plan)["k8s/triton-mig-2g-35gb.yaml"][0]
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/typo"
    with pytest.raises(kubernetes_validate.ValidationError, match="paht"):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_autoscaler_scales_each_profile_on_the_queue_time_metric(plan: MigPlan) -> None:
    docs = documents(plan, BundleSettings(max_gpus=3, queue_target_us=20_000))
    for profile in ("2g.35gb", "1g.18gb+me"):
        name = "triton-mig-" + profile.replace(".", "-").replace("+", "-")
        [hpa] = docs[f"k8s/autoscaling/{name}-hpa.yaml"]
        devices = plan.profile(profile).devices
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (devices, 3 * devices)
        [metric] = hpa["spec"]["metrics"]
        assert metric == {"type": "Pods", "pods": {"metric": {"name": QUEUE_METRIC},
                                                   "target": {"type": "AverageValue", "averageValue": "20000"}}}
    # the adapter rule publishes exactly that metric name, from Triton's own counters, per pod
    [config_map] = docs["k8s/monitoring/prometheus-adapter-rules.yaml"]
    [rule] = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    assert rule == ADAPTER_RULE and rule["name"]["as"] == QUEUE_METRIC
    assert "nv_inference_queue_duration_us" in rule["metricsQuery"] and "nv_inference_request_success" in rule["metricsQuery"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_service_monitor_scrapes_the_metrics_port_of_every_service(plan: MigPlan) -> None:
    docs = documents(plan)
    [monitor] = docs["k8s/monitoring/servicemonitor.yaml"]
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    assert set(monitor["spec"]) == {"selector", "endpoints"}
    [endpoint] = monitor["spec"]["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scheme", "scrapeTimeout"}
    services = [d for docs_ in docs.values() for d in docs_ if d["kind"] == "Service"]
    assert len(services) == 2
    for service in services:
        labels = service["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


KSERVE_MODEL_KEYS = {"modelFormat", "runtime", "runtimeVersion", "storageUri"}  # KServe's, not core/v1 Container fields
KSERVE_PREDICTOR_KEYS = {"minReplicas", "maxReplicas", "model"}


def test_kserve_inference_service_carries_the_profile_flags_and_device(plan: MigPlan) -> None:
    docs = documents(plan)
    [isvc] = docs["k8s/kserve/triton-mig-1g-18gb-me.yaml"]
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    predictor = isvc["spec"]["predictor"]
    assert set(predictor) == KSERVE_PREDICTOR_KEYS | {"securityContext", "tolerations", "initContainers", "volumes"}
    assert predictor["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    model = predictor["model"]
    assert model["modelFormat"] == {"name": "triton"} and model["runtime"] == KSERVE_RUNTIME
    assert model["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3" and "runtimeVersion" not in model  # the image as given
    assert model["storageUri"] == "pvc://triton-model-repository/"
    args = model["args"]
    assert "--model-config-name=1g.18gb+me" in args and "--model-control-mode=explicit" in args
    assert [a for a in args if a.startswith("--load-model=")] == [f"--load-model={m}" for m in plan.profile("1g.18gb+me").loaded]
    # the runtime sets the repository and ports itself
    assert not [a for a in args if a.startswith(("--model-repository", "--http-port", "--grpc-port", "tritonserver"))]
    assert model["resources"]["limits"][mig_resource("1g.18gb+me")] == 1
    # a CPU limit of its own: KServe's default limit (1 CPU) would otherwise apply; front ends + one per instance
    profile_plan = next(p for p in plan.profiles if p.profile.name == "1g.18gb+me")
    needed = 1 + sum(m.instances for m in profile_plan.models) + len(profile_plan.riders)
    assert model["resources"]["limits"]["cpu"] == str(needed) and needed >= 2 and model["resources"]["requests"]["cpu"] == "1"
    # PredictorSpec inlines a core/v1 PodSpec and its model a core/v1 Container: validate those parts as a Pod
    container = {k: v for k, v in model.items() if k not in KSERVE_MODEL_KEYS}
    pod_spec = {k: v for k, v in predictor.items() if k not in KSERVE_PREDICTOR_KEYS}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {**pod_spec, "containers": [{"name": "kserve-container", "image": "x", **container}]}}
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("image", [
    "nvcr.io/nvidia/tritonserver:25.03-py3",
    "registry.example.com:5000/mirror/tritonserver:25.03-py3",
    "nvcr.io/nvidia/tritonserver:25.03-py3@sha256:" + "ab" * 32,
])
def test_the_image_is_kept_exactly_as_given(plan: MigPlan, image: str) -> None:
    """A custom registry and a digest stay as given in every manifest (runtimeVersion would swap only a tag)."""
    docs = documents(plan, BundleSettings(image=image))
    [isvc] = docs["k8s/kserve/triton-mig-2g-35gb.yaml"]
    model = isvc["spec"]["predictor"]["model"]
    assert model["image"] == image and "runtimeVersion" not in model
    deployment = docs["k8s/triton-mig-2g-35gb.yaml"][0]
    spec = deployment["spec"]["template"]["spec"]
    assert {c["image"] for c in [*spec["containers"], *spec["initContainers"]]} == {image}


def test_kserve_runs_raw_deployment_and_every_server_keeps_the_image_entrypoint(plan: MigPlan) -> None:
    """Knative's defaults (KServe's Serverless mode) refuse init containers and pod securityContext fields
    (runAsUser, fsGroup): a manifest with either must ask for RawDeployment. No server container sets
    ``command``, so /opt/nvidia/nvidia_entrypoint.sh runs before tritonserver."""
    for path, docs in documents(plan).items():
        for doc in docs:
            if doc["kind"] == "InferenceService":
                predictor = doc["spec"]["predictor"]
                knative_refuses = "initContainers" in predictor or {"runAsUser", "fsGroup"} & set(predictor.get("securityContext", {}))
                assert knative_refuses  # what makes RawDeployment necessary here
                assert doc["metadata"]["annotations"] == {"serving.kserve.io/deploymentMode": "RawDeployment"}, path
                assert "command" not in predictor["model"]
            elif doc["kind"] == "Deployment":
                [server] = doc["spec"]["template"]["spec"]["containers"]
                assert "command" not in server, path
                assert server["args"][0] == "tritonserver" and server["args"][1].startswith("--")


def test_pods_run_non_root_read_only_with_a_per_pod_tmp_and_the_cache_made_first(plan: MigPlan) -> None:
    for path, docs in documents(plan).items():
        for doc in docs:
            if doc["kind"] == "Deployment":
                spec = doc["spec"]["template"]["spec"]
            elif doc["kind"] == "InferenceService":
                spec = {**doc["spec"]["predictor"], "containers": [doc["spec"]["predictor"]["model"]]}
            else:
                continue
            assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                               "seccompProfile": {"type": "RuntimeDefault"}}
            for container in [*spec["initContainers"], *spec["containers"]]:
                security = container["securityContext"]
                assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
                assert security["readOnlyRootFilesystem"] is True and security["runAsUser"] == 1000
                assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
            assert {"name": "tmp", "emptyDir": {}} in spec["volumes"]  # per pod: no engine cache shared between servers
            [init] = spec["initContainers"]
            loaded = [a.split("=", 1)[1] for a in spec["containers"][0]["args"] if a.startswith("--load-model=")]
            assert init["command"][:2] == ["/bin/sh", "-c"]
            dirs = " ".join(f"/tmp/trt-engine-cache-{m}" for m in sorted(loaded))
            assert init["command"][2] == f"rm -rf {dirs} && mkdir -p {dirs}", path


def test_startup_probe_budget_covers_one_engine_build_per_model(plan: MigPlan) -> None:
    settings = BundleSettings(engine_build_s=600, startup_base_s=60)
    for profile in ("2g.35gb", "1g.18gb+me"):
        name = "triton-mig-" + profile.replace(".", "-").replace("+", "-")
        deployment = documents(plan, settings)[f"k8s/{name}.yaml"][0]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        probe = container["startupProbe"]
        models = len(plan.profile(profile).loaded)
        assert probe["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 60 + 600 * models == startup_budget_s(models, settings)
        assert probe["failureThreshold"] == math.ceil((60 + 600 * models) / probe["periodSeconds"])
        # liveness and readiness stay; the startup probe holds them off, so no guessed initial delay
        assert "initialDelaySeconds" not in container["livenessProbe"] and container["readinessProbe"]


def test_service_monitor_labels_default_to_the_kube_prometheus_stack_release_and_are_configurable(plan: MigPlan) -> None:
    [monitor] = documents(plan)["k8s/monitoring/servicemonitor.yaml"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    custom = BundleSettings(monitor_labels=(("release", "prom"), ("team", "ml")))
    [monitor] = documents(plan, custom)["k8s/monitoring/servicemonitor.yaml"]
    assert monitor["metadata"]["labels"] == {"app.kubernetes.io/name": "triton-mig", "release": "prom", "team": "ml"}


def test_the_written_files_pass_the_kubernetes_validate_command_line(plan: MigPlan, tmp_path: Path) -> None:
    """``kubernetes-validate --strict`` on every written manifest: exit 0; custom resources only warn."""
    paths = [p for p in write_bundle(tmp_path / "bundle", plan) if p.suffix == ".yaml" and "k8s" in p.parts]
    cli = Path(sys.executable).parent / "kubernetes-validate"
    run = subprocess.run([str(cli), "--strict", "-k", K8S_VERSION, *map(str, paths)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    warned = {line.split()[1] for line in (run.stdout + run.stderr).splitlines() if line.startswith("WARN")}
    assert {Path(w).name for w in warned} == {"servicemonitor.yaml", "triton-mig-2g-35gb.yaml", "triton-mig-1g-18gb-me.yaml"}
    assert all("kserve" in w or "monitoring" in w for w in warned)  # only the custom resources are unvalidated
    broken = paths[0].read_text().replace("readOnlyRootFilesystem", "readOnlyRootFileSystem")
    (tmp_path / "broken.yaml").write_text(broken)
    bad = subprocess.run([str(cli), "--strict", "-k", K8S_VERSION, str(tmp_path / "broken.yaml")], capture_output=True, text=True)
    assert bad.returncode != 0 and "readOnlyRootFileSystem" in bad.stdout + bad.stderr
