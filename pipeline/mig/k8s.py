"""Kubernetes manifests for a MIG plan, from one GPU to many.

Per MIG profile with planned models:

- ``k8s/triton-mig-<profile>.yaml``: Deployment + Service. Each pod requests one
  ``nvidia.com/mig-<profile>`` (GPU Operator / device plugin **mixed** strategy; the plugin spells
  ``+me`` profiles with a dot: ``mig-1g.18gb.me``) plus CPU/memory requests and limits; readiness on
  ``/v2/health/ready``, liveness on ``/v2/health/live``, both held off by a startupProbe on
  ``/v2/health/ready`` whose budget covers the TensorRT engine builds of the first load (Triton
  answers nothing until its models are loaded, and ONNX Runtime's TensorRT EP builds engines at
  load, one at a time: the build is inside its process-wide ``GetApiLock()``; see
  :mod:`pipeline.triton.accelerators`): ``startup_base_s + engine_build_s × models``
  (:class:`~pipeline.mig.servers.BundleSettings`; 300 s per engine is an assumption — no engine was
  timed here — change it to what your models take). Replicas start at the devices of one GPU.
- Pods run as the NGC image's non-root ``triton-server`` user (uid/gid 1000), without privilege
  escalation or capabilities, on a read-only root filesystem: ``/tmp`` is an ``emptyDir`` (per pod,
  so no two servers share an engine cache), where an init container creates each model's engine
  cache directory first (ONNX Runtime only creates the leaf, racily: accelerators.py).
- ``k8s/autoscaling/triton-mig-<profile>-hpa.yaml``: an ``autoscaling/v2`` HorizontalPodAutoscaler on a
  Pods metric, ``triton_queue_us_per_request`` (mean time a request waited in Triton's queue), up to
  ``max_gpus`` GPUs' worth of devices; pods that find no free MIG device stay Pending, which is what
  a cluster autoscaler adds GPU nodes for.
- ``k8s/monitoring/``: a ServiceMonitor (Prometheus Operator, ``monitoring.coreos.com/v1``) scraping
  the metrics port, labelled ``settings.monitor_labels`` (default ``release: kube-prometheus-stack``:
  that chart's Prometheus selects ServiceMonitors by its Helm release), and the prometheus-adapter rule (a ConfigMap) that turns Triton's counters
  ``nv_inference_queue_duration_us`` / ``nv_inference_request_success`` into that Pods metric.
- ``k8s/kserve/triton-mig-<profile>.yaml``: the alternative for clusters running KServe, an
  InferenceService (``serving.kserve.io/v1beta1``) on KServe's Triton runtime with the same
  per-profile flags (the runtime sets the repository and ports itself), the bundle image exactly as
  given in the model's ``image`` (``runtimeVersion`` would only swap the tag of the runtime's image:
  a custom registry or a digest would become another image), and the same init container, ``/tmp``
  volume, security context and startupProbe (on the runtime's HTTP port 8080, ``--http-port=8080``
  in KServe's ``kserve-tritonserver`` runtime). It is annotated
  ``serving.kserve.io/deploymentMode: RawDeployment``: KServe's default Serverless mode runs pods
  through Knative, whose default features refuse init containers and pod ``securityContext`` fields
  (``runAsUser``, ``fsGroup``), both of which these pods need.
- Each container states a CPU limit (:func:`cpu_limit`: the front ends, one per model instance and riding step):
  KServe's inferenceservice defaults limit a container to 1 CPU where it sets none, which capped the tuned instances.
- Pods tolerate the GPU nodes' ``nvidia.com/gpu`` taint; ``k8s/preflight.sh`` (:mod:`pipeline.mig.preflight`) checks,
  read-only, the MIG strategy, the resources, the Secrets, the claim's access modes and the GPU nodes' other taints.
- Containers set ``args``, never ``command``, so the NGC image's entrypoint
  (``/opt/nvidia/nvidia_entrypoint.sh``: CUDA forward compatibility on older data-center drivers) runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import math

import yaml

from pipeline.mig.plan import MigPlan, ProfilePlan
from pipeline.mig.preflight import SCRIPT as PREFLIGHT
from pipeline.mig.preflight import preflight_script, tolerations
from pipeline.mig.servers import BundleSettings, container_ports, k8s_name, mig_resource, profile_server
from pipeline.triton.accelerators import cache_setup_shell
from pipeline.triton.bundle_files import AWS_SECRETS, CONTAINER_ADDRESS, CONTAINER_REPOSITORY
from pipeline.triton.server_args import ADMIN_KEY_ENV, K8S_ADMIN_KEY, tritonserver_args

K8S_ADMIN_SECRET = "triton-admin"
K8S_S3_SECRET = "triton-s3"  # keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (kubectl create secret generic ...)
K8S_S3_ACCOUNT = "triton-s3"  # KServe: the ServiceAccount whose Secret its storage initializer reads
APP = "triton-mig"
QUEUE_METRIC = "triton_queue_us_per_request"
KSERVE_RUNTIME = "kserve-tritonserver"
KSERVE_HTTP_PORT = 8080  # the kserve-tritonserver runtime's --http-port
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"
RAW_DEPLOYMENT = "RawDeployment"
TRITON_UID = 1000  # the NGC image's triton-server user and group
STARTUP_PERIOD_S = 10
TMP_VOLUME = "tmp"
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


def cpu_limit(profile_plan: ProfilePlan, settings: BundleSettings) -> str:
    """The CPUs one server needs: one for Triton's HTTP/gRPC front ends, one per model instance (each GPU instance is fed
    by its own host thread) and one per raw-input step riding along (a CPU instance); never below the request. Stated
    as the limit, so KServe's default of 1 CPU (its inferenceservice config's limits) does not cap the tuned instances."""
    needed = 1 + sum(m.instances for m in profile_plan.models) + len(profile_plan.riders)
    return str(max(needed, math.ceil(float(settings.cpu_request))))


def _resources(profile_plan: ProfilePlan, settings: BundleSettings) -> dict[str, Any]:
    device = {mig_resource(profile_plan.profile.name): 1}
    return {
        "requests": {**device, "cpu": settings.cpu_request, "memory": settings.memory_request},
        "limits": {**device, "cpu": cpu_limit(profile_plan, settings), "memory": settings.memory_limit},
    }


def _admin_env(settings: BundleSettings) -> list[dict[str, Any]]:
    env = [{"name": ADMIN_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": K8S_ADMIN_SECRET, "key": "admin-key"}}}]
    if settings.s3 is not None:  # the server reads the bucket: credentials by reference to a Secret, never a value here
        env += [{"name": key, "valueFrom": {"secretKeyRef": {"name": K8S_S3_SECRET, "key": key}}} for key in AWS_SECRETS]
        env.append({"name": "AWS_DEFAULT_REGION", "value": settings.s3.region})
    return env


def s3_service_account(settings: BundleSettings) -> dict[str, Any]:
    """KServe: the ServiceAccount that hands the ``triton-s3`` Secret to the storage initializer (the Secret's
    annotations name the endpoint and region: docs/ngc.md)."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": K8S_S3_ACCOUNT}, "secrets": [{"name": K8S_S3_SECRET}]}


def startup_budget_s(models: int, settings: BundleSettings) -> int:
    """Seconds a server may take to load ``models`` models on first start (engines built one at a time)."""
    return settings.startup_base_s + settings.engine_build_s * max(1, models)


def _startup_probe(port: str | int, models: int, settings: BundleSettings) -> dict[str, Any]:
    budget = startup_budget_s(models, settings)
    return {"httpGet": {"path": "/v2/health/ready", "port": port}, "periodSeconds": STARTUP_PERIOD_S,
            "failureThreshold": math.ceil(budget / STARTUP_PERIOD_S)}


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "runAsUser": TRITON_UID, "runAsGroup": TRITON_UID}


def _pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": TRITON_UID, "runAsGroup": TRITON_UID, "fsGroup": TRITON_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _cache_init(image: str, models: tuple[str, ...]) -> dict[str, Any]:
    """The init container that creates each model's engine cache directory on the pod's /tmp."""
    return {
        "name": "trt-engine-cache",
        "image": image,
        "command": ["/bin/sh", "-c", cache_setup_shell(models)],
        "securityContext": _container_security(),
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": "/tmp"}],
    }


def _tmp_volume() -> dict[str, Any]:
    return {"name": TMP_VOLUME, "emptyDir": {}}


def deployment(profile_plan: ProfilePlan, replicas: int, settings: BundleSettings) -> dict[str, Any]:
    """The Deployment of one profile's servers."""
    profile = profile_plan.profile.name
    name, labels = f"{APP}-{k8s_name(profile)}", _labels(profile)
    http, grpc, metrics = container_ports(settings)
    repository = settings.s3.url if settings.s3 else CONTAINER_REPOSITORY
    args = tritonserver_args(profile_server(profile_plan, repository, (http, grpc, metrics), CONTAINER_ADDRESS, K8S_ADMIN_KEY))
    mounts = [] if settings.s3 else [{"name": "model-repository", "mountPath": CONTAINER_REPOSITORY, "readOnly": True}]
    volumes = [] if settings.s3 else [{"name": "model-repository", "persistentVolumeClaim": {"claimName": settings.pvc_claim, "readOnly": True}}]
    container = {
        "name": "tritonserver",
        "image": settings.image,
        # args, not command: the image's entrypoint (/opt/nvidia/nvidia_entrypoint.sh, which turns on CUDA forward
        # compatibility for older drivers) runs first and execs tritonserver.
        "args": args,
        "env": _admin_env(settings),
        "ports": [
            {"name": "http", "containerPort": http},
            {"name": "grpc", "containerPort": grpc},
            {"name": "metrics", "containerPort": metrics},
        ],
        "resources": _resources(profile_plan, settings),
        "startupProbe": _startup_probe("http", len(profile_plan.loaded), settings),
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
        "securityContext": _container_security(),
        "volumeMounts": [*mounts, {"name": TMP_VOLUME, "mountPath": "/tmp"}],
    }
    if profile_plan.riders and not settings.s3:  # a raw-input ensemble's op library is named relative to the repository
        container["workingDir"] = CONTAINER_REPOSITORY
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
                    "securityContext": _pod_security(),
                    "tolerations": tolerations(),
                    "initContainers": [_cache_init(settings.image, tuple(profile_plan.loaded))],
                    "containers": [container],
                    "volumes": [*volumes, _tmp_volume()],
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
        "metadata": {"name": APP, "labels": {"app.kubernetes.io/name": APP, **dict(settings.monitor_labels)}},
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
    account = {"serviceAccountName": K8S_S3_ACCOUNT} if settings.s3 else {}
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        # RawDeployment: a plain Deployment, not a Knative Service. KServe's default (Serverless) mode runs on
        # Knative, whose defaults refuse init containers and pod securityContext fields such as runAsUser and fsGroup
        # (config-features: kubernetes.podspec-init-containers, kubernetes.podspec-securitycontext, both disabled),
        # and this pod needs both: the engine cache directories made first on a read-only root, as the non-root user.
        "metadata": {"name": f"{APP}-{k8s_name(profile)}", "labels": _labels(profile), "annotations": {DEPLOYMENT_MODE: RAW_DEPLOYMENT}},
        "spec": {
            "predictor": {
                "minReplicas": replicas,
                "maxReplicas": replicas * max(1, settings.max_gpus),
                **account,
                "securityContext": _pod_security(),
                "tolerations": tolerations(),
                "initContainers": [_cache_init(settings.image, tuple(profile_plan.loaded))],
                "volumes": [_tmp_volume()],
                "model": {
                    "modelFormat": {"name": "triton"},
                    "runtime": KSERVE_RUNTIME,
                    # The image exactly as given (a custom registry, a digest): the model's container fields override
                    # the runtime's, where runtimeVersion would only replace the tag of the runtime's own image.
                    "image": settings.image,
                    "storageUri": settings.s3.storage_uri if settings.s3 else f"pvc://{settings.pvc_claim}/",
                    "args": args,
                    "env": _admin_env(settings),
                    "resources": _resources(profile_plan, settings),
                    "startupProbe": _startup_probe(KSERVE_HTTP_PORT, len(profile_plan.loaded), settings),
                    "securityContext": _container_security(),
                    "volumeMounts": [{"name": TMP_VOLUME, "mountPath": "/tmp"}],
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
    if out and settings.s3:
        out["k8s/kserve/s3-service-account.yaml"] = _dump(s3_service_account(settings))
    if out:
        resources = sorted({mig_resource(p.profile.name) for p in plan.profiles if p.profile.name in replicas})
        out[PREFLIGHT] = preflight_script(resources, settings, K8S_ADMIN_SECRET, K8S_S3_SECRET)
        out["k8s/monitoring/servicemonitor.yaml"] = _dump(service_monitor(settings))
        out["k8s/monitoring/prometheus-adapter-rules.yaml"] = _dump(adapter_config())
    return out
