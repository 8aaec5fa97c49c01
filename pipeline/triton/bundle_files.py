"""How deploy bundles are written, shared by ``deploy`` (one server) and ``mig-plan`` (one per MIG device).

* The repository is referenced relative to the bundle folder (scripts resolve it from their own
  location, compose resolves bind mounts from the compose file's folder), so a bundle works from any
  working directory and bundle and repository can move together. Without a known repository the
  bundle requires ``MODEL_REPOSITORY`` to be set.
* Compose services run as the image's non-root ``triton-server`` user with ``init``, mount the
  repository read-only, and get the admin key only through their environment: the command is
  ``bash -c "exec tritonserver ..."`` with ``$$`` so the container's shell (not compose) expands
  ``${TRITON_ADMIN_KEY}`` — ``docker inspect`` shows the variable, never the key.
* Files the user edited are kept: each file's SHA-256 is recorded in ``.pipeline-bundle.json`` when
  written; a file whose content no longer matches is left alone and the new version goes to
  ``<file>.new``, with one log line saying so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.atomic import write_bytes_atomic
from pipeline.triton.server_args import ADMIN_KEY_ENV, ServerArgs, shell_command, tritonserver_args

log = logging.getLogger(__name__)

RECORD = ".pipeline-bundle.json"
CONTAINER_REPOSITORY = "/models"
CONTAINER_USER = "triton-server"  # the NGC image's non-root user
REPOSITORY_ENV = "MODEL_REPOSITORY"
COMPOSE_ADMIN_KEY = f"${{{ADMIN_KEY_ENV}:?export {ADMIN_KEY_ENV}=<secret> first}}"
COMPOSE_REPOSITORY = f"${{{REPOSITORY_ENV}:?set {REPOSITORY_ENV} to the model repository}}"
# Where the host publishes the endpoints: loopback unless the operator says otherwise. Inference,
# metadata, health and metrics carry no authentication in Triton, so exposing them is a decision.
BIND_ENV = "TRITON_BIND_ADDRESS"
DEFAULT_BIND_ADDRESS = "127.0.0.1"
BIND_ADDRESS = f"${{{BIND_ENV}:-{DEFAULT_BIND_ADDRESS}}}"  # the same syntax in bash and compose
# Inside a container (or pod) Triton listens on the container's own interfaces; the host or the
# Kubernetes Service decides what reaches them.
CONTAINER_ADDRESS = "0.0.0.0"


def exposure_note() -> str:
    """The one line a command that writes a bundle says about where its endpoints listen."""
    return (f"the bundle publishes its ports on ${BIND_ENV} (default {DEFAULT_BIND_ADDRESS}); inference and metrics "
            "carry no authentication: expose them (0.0.0.0) only behind an authenticating proxy or a firewall")


def relative_repository(repository: Path | None, bundle_dir: Path) -> str | None:
    """The repository as seen from ``bundle_dir`` (``../model_repository``), or None if unknown."""
    if repository is None:
        return None
    rel = os.path.relpath(Path(repository).absolute(), Path(bundle_dir).absolute())
    return rel if rel.startswith(("/", ".")) else f"./{rel}"


def script_repository_lines(rel_repo: str | None) -> list[str]:
    """Bash lines setting ``$MODEL_REPOSITORY``: the environment wins, else the repository next to the script."""
    if rel_repo is None:
        return [f': "${{{REPOSITORY_ENV}:?set {REPOSITORY_ENV} to the model repository}}"']
    quoted = rel_repo.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return [
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f'{REPOSITORY_ENV}="${{{REPOSITORY_ENV}:-$(cd "$HERE/{quoted}" && pwd)}}"',
    ]


def compose_service(
    *,
    image: str,
    server: ServerArgs,
    ports: Sequence[tuple[int, int]],
    rel_repo: str | None,
    devices: Mapping[str, Any],
    shm_size: str = "1gb",
    setup: str | None = None,
    extra_shell: str = "",
    object_store: str | None = None,
    load_plans: bool = False,
) -> dict[str, Any]:
    """One compose service running ``server`` (its repository must be :data:`CONTAINER_REPOSITORY`).

    ``ports`` are (host, container) pairs, published on ``$TRITON_BIND_ADDRESS`` (default
    127.0.0.1); ``devices`` the GPU reservation
    (``{"count": "all"}`` or ``{"device_ids": [...]}``); ``setup`` a shell command run first in the
    container (the engine cache directories: :func:`pipeline.triton.accelerators.cache_setup_shell`);
    ``extra_shell`` shell words appended to the tritonserver command (evaluated by the container's bash).
    ``object_store``: the region of an ``s3://`` repository the server reads itself (no mount; the AWS
    variables are passed through from the environment by name, never written). ``load_plans``: the server starts without
    the plans, which the plan loader loads once it is ready (:func:`pipeline.triton.plan_loader.serve_then_load`).
    """
    from pipeline.triton.plan_loader import serve_then_load

    serve = shell_command(tritonserver_args(server)) + (f" {extra_shell}" if extra_shell else "")
    command = (f"{setup} && " if setup else "") + (serve_then_load(serve, int(server.http_port or 8000)) if load_plans else "exec " + serve)
    if object_store is not None:  # the server reads the bucket: no mount; credentials by reference from the environment
        return {"image": image, "user": CONTAINER_USER, "init": True, "command": ["bash", "-c", command.replace("$", "$$")],
                "environment": {ADMIN_KEY_ENV: COMPOSE_ADMIN_KEY, **compose_s3_environment(object_store)},
                "ports": [f"{BIND_ADDRESS}:{host}:{inside}" for host, inside in ports], "shm_size": shm_size,
                "ulimits": {"memlock": -1, "stack": 67108864},
                "deploy": {"resources": {"reservations": {"devices": [{"driver": "nvidia", **devices, "capabilities": ["gpu"]}]}}},
                "restart": "unless-stopped"}
    return {
        "image": image,
        "user": CONTAINER_USER,
        "init": True,
        # Compose interpolates ${VAR} itself; "$$" passes a literal "$" so the container's shell expands the key.
        "command": ["bash", "-c", command.replace("$", "$$")],
        "environment": {ADMIN_KEY_ENV: COMPOSE_ADMIN_KEY},
        "ports": [f"{BIND_ADDRESS}:{host}:{inside}" for host, inside in ports],
        "volumes": [{"type": "bind", "source": rel_repo or COMPOSE_REPOSITORY, "target": CONTAINER_REPOSITORY, "read_only": True}],
        "shm_size": shm_size,
        "ulimits": {"memlock": -1, "stack": 67108864},
        "deploy": {"resources": {"reservations": {"devices": [{"driver": "nvidia", **devices, "capabilities": ["gpu"]}]}}},
        "restart": "unless-stopped",
    }


AWS_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")  # required; AWS_SESSION_TOKEN is passed when set


def compose_s3_environment(region: str) -> dict[str, str]:
    """Compose's environment for a server reading S3: every credential interpolated from the host's environment."""
    env = {name: f"${{{name}:?export {name} first: the server reads the model repository from S3}}" for name in AWS_SECRETS}
    return env | {"AWS_SESSION_TOKEN": "${AWS_SESSION_TOKEN:-}", "AWS_DEFAULT_REGION": f"${{AWS_DEFAULT_REGION:-{region}}}"}


def compose_yaml(services: Mapping[str, Any], header: str) -> str:
    """The compose file text: a ``#`` header line, then the services."""
    import yaml

    return f"# {header}\n" + yaml.safe_dump({"services": dict(services)}, sort_keys=False, width=1000)


def write_bundle_files(out_dir: Path, files: Mapping[str, str | bytes], executable: Sequence[str] = ()) -> list[Path]:
    """Write ``{relative path: text or bytes}`` under ``out_dir``, keeping files the user edited since we wrote them.

    Returns the paths written, in order: ``<file>.new`` instead of ``<file>`` for an edited file.
    Each file is replaced atomically; scripts in ``executable`` get mode 755.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    record_path = out_dir / RECORD
    record = _read_record(record_path)
    written = []
    for relpath, text in files.items():
        target = out_dir / relpath
        data = text.encode() if isinstance(text, str) else text
        digest = hashlib.sha256(data).hexdigest()
        key = relpath
        if target.is_file() and target.read_bytes() != data:
            current = hashlib.sha256(target.read_bytes()).hexdigest()
            # Ours: what we last wrote there, or a .new version of ours the user moved into place.
            if current not in (record.get(relpath), record.get(relpath + ".new")):
                target, key = target.with_name(target.name + ".new"), relpath + ".new"
                log.warning("kept %s: it was edited (or not written by the pipeline); the new version is %s",
                            out_dir / relpath, target)
        write_bytes_atomic(target, data, mode=0o755 if relpath in executable else 0o644)
        record[key] = digest
        written.append(target)
    write_bytes_atomic(record_path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
    return written


def _read_record(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
