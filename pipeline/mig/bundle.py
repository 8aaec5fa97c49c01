"""The deployment bundle for a MIG plan: ``launch-mig.sh``, ``docker-compose.yml``, ``k8s/*.yaml``.

Every MIG device runs its own tritonserver with:

- ``CUDA_VISIBLE_DEVICES=MIG-<uuid>`` (or the container runtime's device request for it);
- ``--model-config-name=<profile>`` so each model loads ``configs/<profile>.pbtxt``;
- ``--model-control-mode=explicit --load-model=<m>`` for exactly the models planned on the
  profile (Triton falls back to ``config.pbtxt`` when a custom config is missing, which would
  otherwise load an excluded model with its default instance count);
- its own ports on the host (slot i: base port + i × stride) — in compose and Kubernetes each
  server has its own network namespace, so the container ports stay 8000/8001/8002.

The tritonserver flags come from :mod:`pipeline.triton.server_args` and the files are written by
:mod:`pipeline.triton.bundle_files`, both shared with ``deploy``: the repository is found relative
to the bundle (``MODEL_REPOSITORY`` overrides it), compose services run as the non-root user with
init, the admin key reaches the servers only through their environment, and files the user edited
are kept (the new version goes to ``<file>.new``). Kubernetes manifests: :mod:`pipeline.mig.k8s`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.mig.configs import config_name
from pipeline.mig.nvidia_smi import MigDevice
from pipeline.mig.plan import MigPlan, ProfilePlan
from pipeline.triton.bundle_files import (
    CONTAINER_REPOSITORY,
    REPOSITORY_ENV,
    compose_service,
    compose_yaml,
    relative_repository,
    script_repository_lines,
    write_bundle_files,
)
from pipeline.triton.deploy import DEFAULT_IMAGE
from pipeline.triton.server_args import ADMIN_KEY_ENV, SHELL_ADMIN_KEY, ServerArgs, shell_command, tritonserver_args

LAUNCH_SCRIPT = "launch-mig.sh"
COMPOSE_FILE = "docker-compose.yml"


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


def k8s_name(profile: str) -> str:
    """A DNS-1123 label for a profile: ``1g.18gb+me`` → ``1g-18gb-me``."""
    return profile.lower().replace(".", "-").replace("+", "-")


def mig_resource(profile: str) -> str:
    """The Kubernetes extended resource of a MIG profile under the mixed strategy."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


def profile_server(profile_plan: ProfilePlan, repository: str | None, ports: tuple[int | str | None, ...],
                   admin_key: str = SHELL_ADMIN_KEY, binary: str | None = "tritonserver") -> ServerArgs:
    """How the server of one device of ``profile_plan`` runs: its profile's configs, exactly its models
    (explicit model control, so load/unload go through the key-restricted repository API)."""
    http, grpc, metrics = ports
    return ServerArgs(
        repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics,
        model_control="explicit", load_models=tuple(profile_plan.loaded),
        config_name=config_name(profile_plan.profile.name), admin_key=admin_key, binary=binary,
    )


def server_args(profile_plan: ProfilePlan, repository: str, ports: tuple[int, int, int], admin_key: str = SHELL_ADMIN_KEY) -> list[str]:
    """The tritonserver command line for one device of ``profile_plan``."""
    return tritonserver_args(profile_server(profile_plan, repository, ports, admin_key))


def _slot_ports(settings: BundleSettings, slot: int) -> tuple[int, int, int]:
    step = slot * settings.port_stride
    return settings.http_port + step, settings.grpc_port + step, settings.metrics_port + step


def _container_ports(settings: BundleSettings) -> tuple[int, int, int]:
    return settings.http_port, settings.grpc_port, settings.metrics_port


def launch_script(plan: MigPlan, settings: BundleSettings = BundleSettings()) -> str:
    """A bash script that starts one tritonserver per MIG device listed by ``nvidia-smi -L``."""
    served = [p for p in plan.profiles if p.loaded]
    cases = []
    for p in served:
        server = profile_server(p, f"${REPOSITORY_ENV}", ("$http", "$grpc", "$metrics"), binary="$TRITONSERVER")
        cases.append(f'    "{p.profile.name}") args=({shell_command(tritonserver_args(server))}) ;;')
    layout = str(plan.layout) if plan.layout else "any layout of these profiles"
    lines = "\n".join(script_repository_lines(settings.repository))
    case_lines = "\n".join(cases)
    return f"""#!/usr/bin/env bash
# Generated by `python -m pipeline mig-plan` for {plan.gpu.name} ({layout}).
# Starts one tritonserver per MIG device found by `nvidia-smi -L` (in its order):
#   CUDA_VISIBLE_DEVICES=<MIG UUID>, ports base + slot*{settings.port_stride}, and
#   --model-config-name=<the device's profile> so each model reads configs/<profile>.pbtxt.
# Usage: launch-mig.sh [--dry-run]
#   MIG_DEVICES_FILE=<saved `nvidia-smi -L` output>  read devices from a file instead
#   {REPOSITORY_ENV} (default: the repository next to this bundle), TRITONSERVER, HTTP_BASE, GRPC_BASE,
#   METRICS_BASE, PORT_STRIDE  override
set -euo pipefail
: "${{{ADMIN_KEY_ENV}:?set {ADMIN_KEY_ENV}: the servers restrict their admin APIs to this key}}"
{lines}
TRITONSERVER="${{TRITONSERVER:-tritonserver}}"
HTTP_BASE="${{HTTP_BASE:-{settings.http_port}}}"
GRPC_BASE="${{GRPC_BASE:-{settings.grpc_port}}}"
METRICS_BASE="${{METRICS_BASE:-{settings.metrics_port}}}"
PORT_STRIDE="${{PORT_STRIDE:-{settings.port_stride}}}"
DRY_RUN=0
if [[ "${{1:-}}" == "--dry-run" ]]; then DRY_RUN=1; fi

if [[ -n "${{MIG_DEVICES_FILE:-}}" ]]; then
  listing="$(cat "$MIG_DEVICES_FILE")"
else
  listing="$(nvidia-smi -L)"
fi

mig_re='^[[:space:]]+MIG[[:space:]]+([^[:space:]]+)[[:space:]]+Device[[:space:]]+([0-9]+):[[:space:]]+\\(UUID:[[:space:]]*(MIG-[^)[:space:]]+)\\)'
pids=()
slot=0
while IFS= read -r line; do
  [[ $line =~ $mig_re ]] || continue
  profile="${{BASH_REMATCH[1]}}"
  uuid="${{BASH_REMATCH[3]}}"
  http=$((HTTP_BASE + slot * PORT_STRIDE))
  grpc=$((GRPC_BASE + slot * PORT_STRIDE))
  metrics=$((METRICS_BASE + slot * PORT_STRIDE))
  # MIG profile -> the server of its devices: configs/<profile>.pbtxt and the models planned on it
  case "$profile" in
{case_lines}
    *) echo "launch-mig.sh: skipping $uuid: no model is planned for MIG profile $profile (re-run mig-plan for this layout)" >&2
       continue ;;
  esac
  if [[ $DRY_RUN -eq 1 ]]; then
    echo "CUDA_VISIBLE_DEVICES=$uuid ${{args[*]}}"
  else
    echo "launch-mig.sh: $profile $uuid -> http :$http grpc :$grpc metrics :$metrics" >&2
    CUDA_VISIBLE_DEVICES="$uuid" "${{args[@]}}" &
    pids+=("$!")
  fi
  slot=$((slot + 1))
done <<< "$listing"

if [[ $slot -eq 0 ]]; then
  echo "launch-mig.sh: no MIG device with a planned profile in nvidia-smi -L; create the MIG layout first" >&2
  exit 1
fi
if [[ $DRY_RUN -eq 1 ]]; then exit 0; fi
trap 'kill "${{pids[@]}}" 2>/dev/null || true; wait' INT TERM
wait
"""


def _slots(plan: MigPlan, devices: list[MigDevice] | None) -> list[tuple[ProfilePlan, str | None]]:
    """(profile plan, MIG UUID or None) per device, in layout or ``nvidia-smi -L`` order."""
    if devices:
        by_name = {p.profile.name: p for p in plan.profiles}
        return [(by_name[d.profile], d.uuid) for d in devices if d.profile in by_name and by_name[d.profile].loaded]
    if plan.layout is not None:
        by_name = {p.profile.name: p for p in plan.profiles}
        return [(by_name[s.name], None) for s in plan.layout.slices if by_name[s.name].loaded]
    return [(p, None) for p in plan.profiles if p.loaded]


def compose_file(plan: MigPlan, settings: BundleSettings = BundleSettings(), devices: list[MigDevice] | None = None) -> str:
    """docker compose: one service per MIG device, the device requested by UUID.

    Without ``devices`` (a parsed ``nvidia-smi -L``) the UUIDs are required variables
    ``MIG_UUID_<slot>``; compose refuses to start until they are set.
    """
    services = {}
    for slot, (profile_plan, uuid) in enumerate(_slots(plan, devices)):
        name = f"triton-{slot}-{k8s_name(profile_plan.profile.name)}"
        device_id = uuid or f"${{MIG_UUID_{slot}:?set MIG_UUID_{slot} to the UUID of a {profile_plan.profile.name} device from nvidia-smi -L}}"
        inside = _container_ports(settings)
        services[name] = compose_service(
            image=settings.image,
            server=profile_server(profile_plan, CONTAINER_REPOSITORY, inside),
            ports=list(zip(_slot_ports(settings, slot), inside)),
            rel_repo=settings.repository,
            devices={"device_ids": [device_id]},
            shm_size="256m",
        )
    return compose_yaml(services, f"One tritonserver per MIG device of {plan.gpu.name}: {ADMIN_KEY_ENV}=<secret> docker compose up")


def bundle_files(plan: MigPlan, settings: BundleSettings = BundleSettings(), devices: list[MigDevice] | None = None) -> dict[str, str]:
    """Every bundle file, by path relative to the bundle folder."""
    from pipeline.mig.k8s import k8s_manifests

    files = {LAUNCH_SCRIPT: launch_script(plan, settings), COMPOSE_FILE: compose_file(plan, settings, devices)}
    files.update(k8s_manifests(plan, settings, _replicas(plan, devices)))
    return files


def _replicas(plan: MigPlan, devices: list[MigDevice] | None) -> dict[str, int]:
    """Devices per profile with planned models (one GPU's layout, or the listed devices)."""
    replicas: dict[str, int] = {}
    for profile_plan, _ in _slots(plan, devices):
        replicas[profile_plan.profile.name] = replicas.get(profile_plan.profile.name, 0) + 1
    return replicas


def write_bundle(out_dir: Path, plan: MigPlan, settings: BundleSettings = BundleSettings(),
                 devices: list[MigDevice] | None = None, repository: Path | None = None) -> list[Path]:
    """Write :func:`bundle_files` under ``out_dir``; ``repository`` (the model repository) is referenced
    relative to ``out_dir``. Returns the paths written (``<file>.new`` for files the user edited)."""
    if repository is not None:
        settings = replace(settings, repository=relative_repository(repository, out_dir))
    return write_bundle_files(out_dir, bundle_files(plan, settings, devices), executable=[LAUNCH_SCRIPT])
