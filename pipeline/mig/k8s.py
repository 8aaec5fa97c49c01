"""Kubernetes manifests for a MIG plan, from one GPU to many.

Per MIG profile with planned models:

- ``k8s/triton-mig-<profile>.yaml``: Deployment + Service. Each pod requests one
  ``nvidia.com/mig-<profile>`` (GPU Operator / device plugin **mixed** strategy; the plugin spells
  ``+me`` profiles with a dot: ``mig-1g.18gb.me``) plus CPU/memory requests and limits; readiness on
  ``/v2/health/ready``, liveness on ``/v2/health/live``. Replicas start at the devices of one GPU.
- ``k8s/autoscaling/triton-mig-<profile>-hpa.yaml``: an ``autoscaling/v2`` HorizontalPodAutoscaler on a
  Pods metric, ``triton_queue_us_per_request`` (mean time a request waited in Triton's queue), up to
  ``max_gpus`` GPUs' worth of devices; pods that find no free MIG device stay Pending, which is what
  a cluster autoscaler adds GPU nodes for.
- ``k8s/monitoring/``: a ServiceMonitor (Prometheus Operator, ``monitoring.coreos.com/v1``) scraping
  the metrics port, and the prometheus-adapter rule (a ConfigMap) that turns Triton's counters
  ``nv_inference_queue_duration_us`` / ``nv_inference_request_success`` into that Pods metric.
- ``k8s/kserve/triton-mig-<profile>.yaml``: the alternative for clusters running KServe, an
  InferenceService (``serving.kserve.io/v1beta1``) on KServe's Triton runtime with the same
  per-profile flags (the runtime sets the repository and ports itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from pipeline.mig.servers import BundleSettings, container_ports, k8s_name, mig_resource, profile_server
from pipeline.mig.plan import MigPlan, ProfilePlan
from pipeline.triton.bundle_files import CONTAINER_ADDRESS, CONTAINER_REPOSITORY
from pipeline.triton.server_args import ADMIN_KEY_ENV, K8S_ADMIN_KEY, tritonserver_args

K8S_ADMIN_SECRET = "triton-admin"
APP = "triton-mig"
QUEUE_METRIC = "triton_queue_us_per_request"
KSERVE_RUNTIME = "kserve-tritonserver"
# prometheus-adapter rule: queue time per successful request over the last minute, per pod.
ADAPTER_RULE = {
    "seriesQuery": 'nv_inference_queue_duration_us{namespace!="",pod!=""}',
    "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
    "name": {"matches": "^nv_inference_queue_duration_us$", "as": QUEUE_METRIC},
    "metricsQuery": (
        "sum(rate(nv_inference_queue_duration_us{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)"
        " / clamp_min(sum(rate(nv_inference_request_success{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>), 1e-3)"
    ),
}


class _Dumper(yaml.SafeDumper):
    """Safe YAML without anchors/aliases: each manifest reads on its own."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _dump(*docs: Mapping[str, Any]) -> str:
    return yaml.dump_all(list(docs), Dumper=_Dumper, sort_keys=False, width=1000)


def _labels(profile: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "mig-profile": k8s_name(profile)}


def _resources(profile: str, settings: BundleSettings) -> dict[str, Any]:
    device = {mig_resource(profile): 1}
    return {
        "requests": {**device, "cpu": settings.cpu_request, "memory": settings.memory_request},
        "limits": {**device, "memory": settings.memory_limit},
    }


def _admin_env() -> list[dict[str, Any]]:
    return [{"name": ADMIN_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": K8S_ADMIN_SECRET, "key": "admin-key"}}}]


def deployment(profile_plan: ProfilePlan, replicas: int, settings: BundleSettings) -> dict[str, Any]:
    """The Deployment of one profile's servers."""
    profile = profile_plan.profile.name
    name, labels = f"{APP}-{k8s_name(profile)}", _labels(profile)
    http, grpc, metrics = container_ports(settings)
    args = tritonserver_args(profile_server(profile_plan, CONTAINER_REPOSITORY, (http, grpc, metrics), CONTAINER_ADDRESS, K8S_ADMIN_KEY))
    container = {
        "name": "tritonserver",
        "image": settings.image,
        "command": args[:1],
        "args": args[1:],
        "env": _admin_env(),
        "ports": [
            {"name": "http", "containerPort": http},
            {"name": "grpc", "containerPort": grpc},
            {"name": "metrics", "containerPort": metrics},
        ],
        "resources": _resources(profile, settings),
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 5},
        # Generous: model loading (warmup included) happens before the server answers at all.
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"}, "initialDelaySeconds": 60,
                          "periodSeconds": 10, "failureThreshold": 6},
        "volumeMounts": [{"name": "model-repository", "mountPath": CONTAINER_REPOSITORY, "readOnly": True}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [container],
                    "volumes": [{"name": "model-repository", "persistentVolumeClaim": {"claimName": settings.pvc_claim, "readOnly": True}}],
                },
            },
        },
    }


def service(profile: str, settings: BundleSettings) -> dict[str, Any]:
    """The Service in front of one profile's servers (the metrics port is what the ServiceMonitor scrapes)."""
    http, grpc, metrics = container_ports(settings)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{APP}-{k8s_name(profile)}", "labels": _labels(profile)},
        # Cluster-internal only: inference and metrics carry no authentication (README: "Exposure").
        "spec": {
            "type": "ClusterIP",
            "selector": _labels(profile),
            "ports": [
                {"name": "http", "port": http, "targetPort": "http"},
                {"name": "grpc", "port": grpc, "targetPort": "grpc"},
                {"name": "metrics", "port": metrics, "targetPort": "metrics"},
            ],
        },
    }


def autoscaler(profile: str, replicas: int, settings: BundleSettings) -> dict[str, Any]:
    """HPA: more pods of this profile while requests queue longer than ``settings.queue_target_us``."""
    name = f"{APP}-{k8s_name(profile)}"
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": _labels(profile)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": replicas,
            "maxReplicas": replicas * max(1, settings.max_gpus),
            "metrics": [{
                "type": "Pods",
                "pods": {"metric": {"name": QUEUE_METRIC}, "target": {"type": "AverageValue", "averageValue": str(settings.queue_target_us)}},
            }],
            # Model loading takes a while: do not scale in on a short lull.
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }


def service_monitor(settings: BundleSettings) -> dict[str, Any]:
    """Prometheus Operator ServiceMonitor for every profile's metrics port."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": APP, "labels": {"app.kubernetes.io/name": APP}},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": APP}},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def adapter_config() -> dict[str, Any]:
    """prometheus-adapter's config (``rules``) exposing :data:`QUEUE_METRIC` to the HPA."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "triton-prometheus-adapter-rules", "labels": {"app.kubernetes.io/name": APP}},
        "data": {"config.yaml": yaml.safe_dump({"rules": [ADAPTER_RULE]}, sort_keys=False, width=1000)},
    }


def inference_service(profile_plan: ProfilePlan, replicas: int, settings: BundleSettings) -> dict[str, Any]:
    """KServe InferenceService on the Triton runtime (which passes the repository and ports itself)."""
    profile = profile_plan.profile.name
    args = tritonserver_args(profile_server(profile_plan, None, (None, None, None), None, K8S_ADMIN_KEY, binary=None))
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": f"{APP}-{k8s_name(profile)}", "labels": _labels(profile)},
        "spec": {
            "predictor": {
                "minReplicas": replicas,
                "maxReplicas": replicas * max(1, settings.max_gpus),
                "model": {
                    "modelFormat": {"name": "triton"},
                    "runtime": KSERVE_RUNTIME,
                    "storageUri": f"pvc://{settings.pvc_claim}/",
                    "args": args,
                    "env": _admin_env(),
                    "resources": _resources(profile, settings),
                },
            }
        },
    }


def k8s_manifests(plan: MigPlan, settings: BundleSettings, replicas: Mapping[str, int]) -> dict[str, str]:
    """Every Kubernetes file, by path relative to the bundle folder; ``replicas``: devices per profile."""
    out: dict[str, str] = {}
    for profile_plan in plan.profiles:
        profile = profile_plan.profile.name
        if profile not in replicas:
            continue
        name = f"{APP}-{k8s_name(profile)}"
        count = replicas[profile]
        out[f"k8s/{name}.yaml"] = _dump(deployment(profile_plan, count, settings), service(profile, settings))
        out[f"k8s/autoscaling/{name}-hpa.yaml"] = _dump(autoscaler(profile, count, settings))
        out[f"k8s/kserve/{name}.yaml"] = _dump(inference_service(profile_plan, count, settings))
    if out:
        out["k8s/monitoring/servicemonitor.yaml"] = _dump(service_monitor(settings))
        out["k8s/monitoring/prometheus-adapter-rules.yaml"] = _dump(adapter_config())
    return out
