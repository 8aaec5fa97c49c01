"""A production deploy bundle for a model repository: ``docker-run.sh`` and ``compose.yaml`` for NGC Triton.

Image: ``nvcr.io/nvidia/tritonserver:24.10-py3`` by default. It is Triton 2.51, the same server as the
local ``tritonserver`` the repository is served and tested with, so config semantics match; its
ONNX Runtime is 1.19.2 (Triton's compatibility matrix), which loads ONNX IR ≤ 10 and opset ≤ 21 —
checked here for every ONNX model. A TensorRT plan only loads on the TensorRT version that built it,
so a repository with plans needs ``image=`` set to the NGC tag whose TensorRT built them.

The server's flags come from :mod:`pipeline.triton.server_args` (shared with ``serve`` and the MIG
bundle): ``--model-control-mode=none`` (the repository is loaded at start and cannot be changed
through the API), ``--strict-readiness``, ``--disable-auto-complete-config``, and the admin APIs
behind the header ``admin-key: $TRITON_ADMIN_KEY``. How the files are written (repository relative to
the bundle, non-root user, init, key only in the environment, user edits kept) is
:mod:`pipeline.triton.bundle_files`, shared with the MIG bundle.
"""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError, require
from pipeline.triton.bundle_files import (
    BIND_ADDRESS,
    BIND_ENV,
    CONTAINER_ADDRESS,
    CONTAINER_REPOSITORY,
    DEFAULT_BIND_ADDRESS,
    exposure_note,
    CONTAINER_USER,
    compose_service,
    compose_yaml,
    relative_repository,
    script_repository_lines,
    write_bundle_files,
)
from pipeline.triton.repository import REPORT, model_filename, read_repository
from pipeline.triton.server_args import (
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    RESTRICTED_APIS,
    ServerArgs,
    shell_command,
    tritonserver_args,
)

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
# What the default image's ONNX Runtime (1.19.2) can load: newest ONNX IR version and ai.onnx opset.
DEFAULT_IMAGE_ONNX_LIMITS = (10, 21)
SCRIPT, COMPOSE, README = "docker-run.sh", "compose.yaml", "README.md"


def server_args(http_port: int = 8000, grpc_port: int = 8001, metrics_port: int = 8002) -> ServerArgs:
    """How the production server runs: the whole repository loaded at start, admin APIs behind the key."""
    return ServerArgs(repository=CONTAINER_REPOSITORY, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                      host=CONTAINER_ADDRESS)


def write_deploy_bundle(
    repository: Path,
    out_dir: Path,
    *,
    image: str = DEFAULT_IMAGE,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
) -> list[Path]:
    """Write ``docker-run.sh``, ``compose.yaml`` and ``README.md`` to ``out_dir`` serving ``repository``.

    The repository is referenced relative to ``out_dir`` so bundle and repository can move together.
    Files the user edited are kept (the new version goes to ``<file>.new``). Raises PipelineError if
    a model cannot load in ``image`` (ONNX too new for its ONNX Runtime, or TensorRT plans with the
    default image).
    """
    ports = (http_port, grpc_port, metrics_port)
    require(all(1 <= p <= 65535 for p in ports) and len(set(ports)) == 3, f"ports {ports} must be distinct and in 1..65535", "pick three free ports")
    models = read_repository(repository)
    _check_image_can_load(Path(repository), models, image)

    out_dir = Path(out_dir)
    rel_repo = relative_repository(Path(repository), out_dir)
    server = server_args(http_port, grpc_port, metrics_port)
    service = compose_service(image=image, server=server, ports=[(p, p) for p in ports], rel_repo=rel_repo, devices={"count": "all"})
    files = {
        SCRIPT: _docker_run_script(image, rel_repo, shell_command(tritonserver_args(server)), ports),
        COMPOSE: compose_yaml({"triton": service}, f"Serve the model repository with {image}: {ADMIN_KEY_ENV}=<secret> docker compose up"),
        README: _readme(image, sorted(models), ports),
    }
    paths = write_bundle_files(out_dir, files, executable=[SCRIPT])
    log.info("deploy bundle for %s (%s) written to %s", repository, image, out_dir)
    log.info("%s", exposure_note())
    return paths


def _docker_run_script(image: str, rel_repo: str | None, server: str, ports: tuple[int, ...]) -> str:
    publish = " ".join(f'-p "{BIND_ADDRESS}:{p}:{p}"' for p in ports)
    docker = [
        "docker run --rm --init",
        '--gpus "${TRITON_GPUS:-all}"',
        f"--user {CONTAINER_USER}",
        "--shm-size=1g --ulimit memlock=-1 --ulimit stack=67108864",
        publish,
        '-v "${MODEL_REPOSITORY}:' + CONTAINER_REPOSITORY + ':ro"',
        f"-e {ADMIN_KEY_ENV}",
        shlex.quote(image),
        "bash -c " + shlex.quote("exec " + server),
    ]
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# Serve the model repository with {image}. Written by the pipeline: edits are kept (a regenerated version goes to docker-run.sh.new).",
        f"# Admin APIs ({', '.join(RESTRICTED_APIS)}) need the header '{ADMIN_HEADER}: ${ADMIN_KEY_ENV}'",
        f"# (gRPC metadata 'triton-grpc-protocol-{ADMIN_HEADER}'). TRITON_GPUS picks GPUs, e.g. '\"device=0\"' or a MIG UUID;",
        "# MODEL_REPOSITORY overrides the repository next to this bundle. Ports are published on",
        f"# {BIND_ENV} (default {DEFAULT_BIND_ADDRESS}); inference and metrics need no key: see README.md.",
        "set -euo pipefail",
        f': "${{{ADMIN_KEY_ENV}:?export {ADMIN_KEY_ENV}=<secret> first: it unlocks the admin APIs}}"',
        *script_repository_lines(rel_repo),
        "exec " + " \\\n  ".join(docker),
        "",
    ])


def _readme(image: str, models: list[str], ports: tuple[int, ...]) -> str:
    http, grpc, metrics = ports
    return "\n".join([
        "# Triton deploy bundle",
        "",
        f"Serves {', '.join(models)} with `{image}` on a GPU host (NVIDIA Container Toolkit).",
        "",
        f"    export {ADMIN_KEY_ENV}=$(openssl rand -hex 32)",
        "    ./docker-run.sh            # or: docker compose up",
        f"    curl -fsS localhost:{http}/v2/health/ready",
        f'    curl -fsS -H "{ADMIN_HEADER}: ${ADMIN_KEY_ENV}" -X POST localhost:{http}/v2/repository/index',
        "",
        f"HTTP {http}, gRPC {grpc}, metrics {metrics}. Inference, health, metadata and statistics are open;",
        f"{', '.join(RESTRICTED_APIS)} need the `{ADMIN_HEADER}` header (gRPC: `triton-grpc-protocol-{ADMIN_HEADER}`).",
        f"The ports are published on `${BIND_ENV}` (default `{DEFAULT_BIND_ADDRESS}`: this host only).",
        f"Inference, metadata, health and metrics carry no authentication: before setting `{BIND_ENV}=0.0.0.0`,",
        "put the ports behind a proxy that authenticates (e.g. NGINX or Envoy with mTLS or tokens) or a firewall.",
        "Models load once at start (`--model-control-mode=none`); publish a new build, then restart.",
        "Files you edit here are kept when the bundle is regenerated: the new version is written beside them as `<file>.new`.",
        "",
    ])


def _check_image_can_load(repository: Path, models: dict[str, Any], image: str) -> None:
    if image != DEFAULT_IMAGE:
        log.warning("not checking that %s can load every model: only %s's limits are known", image, DEFAULT_IMAGE)
        return
    import onnx

    max_ir, max_opset = DEFAULT_IMAGE_ONNX_LIMITS
    for name, info in models.items():
        if info.config.platform == "tensorrt_plan" or info.config.backend == "tensorrt":
            raise PipelineError(
                f"model {name} is a TensorRT plan{_trt_version(info.path)}, and a plan only loads on the TensorRT version that built it",
                "pass image= (or --image) the NGC tritonserver tag whose release notes list that TensorRT version",
            )
        if info.config.platform != "onnxruntime_onnx" and info.config.backend != "onnxruntime":
            continue
        filename = model_filename(info.config)
        for version in info.versions:
            path = info.path / str(version) / filename
            if path.is_dir():
                path = path / "model.onnx"
            proto = onnx.load(str(path), load_external_data=False)
            opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
            require(
                proto.ir_version <= max_ir and opset <= max_opset,
                f"{path} has ONNX IR version {proto.ir_version} and opset {opset}, but {image} (ONNX Runtime 1.19.2) loads at most IR {max_ir} / opset {max_opset}",
                "export with a lower --opset (and IR version), or pass image= a newer tritonserver tag",
            )


def _trt_version(model_dir: Path) -> str:
    try:
        versions = json.loads((model_dir / REPORT).read_text())["versions"]
        meta = versions[max(versions, key=int)].get("engine_metadata") or {}
        found = meta.get("tensorrt_version") or meta.get("trt_version")
        return f" built with TensorRT {found}" if found else ""
    except (OSError, ValueError, KeyError, TypeError):
        return ""
