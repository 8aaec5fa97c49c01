"""Every generated Kubernetes manifest validates offline against the Kubernetes API schemas
(``kubernetes-validate``, strict: unknown fields fail). ServiceMonitor and InferenceService are
custom resources the validator has no schema for (it says so: SchemaNotFoundError); their structure
is checked here field by field against the Prometheus Operator and KServe v1beta1 APIs instead."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pipeline.mig.bundle import bundle_files
from pipeline.mig.k8s import ADAPTER_RULE, KSERVE_RUNTIME, QUEUE_METRIC
from pipeline.mig.layout import parse_layout
from pipeline.mig.memory import MemoryEstimate, memory_from_onnx
from pipeline.mig.servers import BundleSettings, mig_resource
from pipeline.mig.plan import GIB, MigPlan, plan_instances
from pipeline.mig.profiles import builtin_gpu

K8S_VERSION = "1.37.0"
CUSTOM = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("serving.kserve.io/v1beta1", "InferenceService")}


@pytest.fixture
def plan(tiny_onnx: Path) -> MigPlan:
    h200 = builtin_gpu("H200-141GB")
    memory = {"tiny_fp32": memory_from_onnx(tiny_onnx, 8), "big": MemoryEstimate("hand-written", GIB, 20 * GIB)}
    return plan_instances(h200, memory, parse_layout("3x2g.35gb,1x1g.18gb+me", h200))


def documents(plan: MigPlan, settings: BundleSettings = BundleSettings()) -> dict[str, list[dict]]:
    files = bundle_files(plan, settings)
    return {path: [d for d in yaml.safe_load_all(text) if d] for path, text in files.items() if path.startswith("k8s/")}


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


def test_kserve_inference_service_carries_the_profile_flags_and_device(plan: MigPlan) -> None:
    docs = documents(plan)
    [isvc] = docs["k8s/kserve/triton-mig-1g-18gb-me.yaml"]
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    predictor = isvc["spec"]["predictor"]
    assert set(predictor) == {"minReplicas", "maxReplicas", "model"}
    model = predictor["model"]
    assert model["modelFormat"] == {"name": "triton"} and model["runtime"] == KSERVE_RUNTIME
    assert model["storageUri"] == "pvc://triton-model-repository/"
    args = model["args"]
    assert "--model-config-name=1g.18gb+me" in args and "--model-control-mode=explicit" in args
    assert [a for a in args if a.startswith("--load-model=")] == [f"--load-model={m}" for m in plan.profile("1g.18gb+me").loaded]
    # the runtime sets the repository and ports itself
    assert not [a for a in args if a.startswith(("--model-repository", "--http-port", "--grpc-port", "tritonserver"))]
    assert model["resources"]["limits"][mig_resource("1g.18gb+me")] == 1
    # same container fields as a Deployment's: they validate as a core/v1 Container
    container = {"name": "kserve-container", "image": "x", "args": args, "env": model["env"], "resources": model["resources"]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [container]}}
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
