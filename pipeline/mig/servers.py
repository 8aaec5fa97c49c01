"""What every server of a MIG bundle runs, shared by the launch script and compose (:mod:`pipeline.mig.bundle`)
and the Kubernetes manifests (:mod:`pipeline.mig.k8s`): the bundle settings, a profile's server and names."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.mig.configs import config_name
from pipeline.mig.plan import ProfilePlan
from pipeline.triton.deploy import DEFAULT_IMAGE
from pipeline.triton.server_args import SHELL_ADMIN_KEY, ServerArgs


@dataclass(frozen=True)
class BundleSettings:
    """What the bundle runs and where: image, repository, ports, Kubernetes sizing."""

    image: str = DEFAULT_IMAGE
    # The model repository relative to the bundle folder (relative_repository()); None: MODEL_REPOSITORY must be set.
    repository: str | None = None
    pvc_claim: str = "triton-model-repository"  # Kubernetes volume holding the repository
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    port_stride: int = 10  # slot i listens on base + i × stride (launch script, compose host ports)
    max_gpus: int = 4  # Kubernetes: the autoscaler grows each profile up to this many GPUs' worth of devices
    queue_target_us: int = 10_000  # Kubernetes: scale out when the mean queue time per request exceeds this
    cpu_request: str = "1"  # Kubernetes requests/limits beside the MIG device
    memory_request: str = "4Gi"
    memory_limit: str = "8Gi"
    # Kubernetes startupProbe budget: startup_base_s + engine_build_s per model the server loads (ONNX
    # Runtime's TensorRT EP builds one engine per model at load, one at a time: pipeline.mig.k8s).
    engine_build_s: int = 300
    startup_base_s: int = 120
    # Labels of the ServiceMonitor: kube-prometheus-stack's Prometheus selects ServiceMonitors by its
    # Helm release name (serviceMonitorSelector: release=<name>); set it to yours.
    monitor_labels: tuple[tuple[str, str], ...] = (("release", "kube-prometheus-stack"),)
    # An s3:// repository the servers read themselves (Kubernetes: no volume; credentials from a Secret).
    s3: S3Bundle | None = None


@dataclass(frozen=True)
class S3Bundle:
    """Where bundled servers find an ``s3://`` repository: ``url`` as tritonserver reads it (with the endpoint of an
    S3-compatible store), ``storage_uri`` as KServe reads it, the region; credentials are never part of it."""

    url: str
    storage_uri: str
    region: str
    endpoint: str | None = None


def k8s_name(profile: str) -> str:
    """A DNS-1123 label for a profile: ``1g.18gb+me`` → ``1g-18gb-me``."""
    return profile.lower().replace(".", "-").replace("+", "-")


def mig_resource(profile: str) -> str:
    """The Kubernetes extended resource of a MIG profile under the mixed strategy."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


def profile_server(profile_plan: ProfilePlan, repository: str | None, ports: tuple[int | str | None, ...], host: str | None,
                   admin_key: str = SHELL_ADMIN_KEY, binary: str | None = "tritonserver") -> ServerArgs:
    """How the server of one device of ``profile_plan`` runs: its profile's configs, exactly its models
    (explicit model control, so load/unload go through the key-restricted repository API), listening
    on ``host`` (None: a platform such as KServe's runtime decides)."""
    http, grpc, metrics = ports
    return ServerArgs(
        repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics, host=host,
        model_control="explicit", load_models=tuple(profile_plan.loaded),
        config_name=config_name(profile_plan.profile.name), admin_key=admin_key, binary=binary,
    )


def container_ports(settings: BundleSettings) -> tuple[int, int, int]:
    """The ports inside each container (every server has its own network namespace there)."""
    return settings.http_port, settings.grpc_port, settings.metrics_port
