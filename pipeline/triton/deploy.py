"""A production deploy bundle for a model repository: ``docker-run.sh`` and ``compose.yaml`` for NGC Triton.

Image: ``nvcr.io/nvidia/tritonserver:24.10-py3`` by default, Triton 2.51, the same server as the
local ``tritonserver`` the repository is served and tested with, so config semantics match. Any
other tag is checked against the NGC release table (:mod:`pipeline.triton.ngc_releases`): an
image older than 24.10 is refused, a listed tag must load every model's ONNX IR version and opset
(and a plan's TensorRT), and what could not be checked is logged in one line.

The bundle is for a GPU host: the server runs ``--model-control-mode=explicit`` with one
``--load-model`` per GPU model, so models whose every instance group is ``KIND_CPU`` (the
``*_int8cpu`` variants made for ONNX Runtime's CPU kernels) stay in the repository, with their
CPU config, for CPU deployments, and are not loaded here. Before the server starts, the container
empties and creates each model's TensorRT engine cache directory (why: "Engine cache" in
:mod:`pipeline.triton.accelerators`).

The server's other flags come from :mod:`pipeline.triton.server_args` (shared with ``serve`` and
the MIG bundle): ``--strict-readiness``, ``--disable-auto-complete-config``, and the admin APIs
(model load/unload included) behind the header ``admin-key: $TRITON_ADMIN_KEY``. How the files are
written (repository relative to the bundle, non-root user, init, key only in the environment, user
edits kept) is :mod:`pipeline.triton.bundle_files`, shared with the MIG bundle.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.core.errors import require
from pipeline.core.objectstore import S3Url
from pipeline.triton.accelerators import cache_setup_shell
from pipeline.triton.bundle_files import (
    AWS_SECRETS,
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
from pipeline.triton.deploy_plans import CONTAINER_PLANS, SCRIPT as PLANS_SCRIPT, build_plans_script, docker_run_plans_lines, \
    plan_builds, plans_service, with_plans
from pipeline.triton.plan_loader import LOADER, LOADER_SOURCE, WHEEL_DIR, polygraphy_wheel, serve_then_load
from pipeline.triton.ngc_releases import DEFAULT_IMAGE, NGC_REPOSITORY, check_image, ngc_tag, repository_needs
from pipeline.triton.repository import read_repository
from pipeline.triton.s3repository import readable
from pipeline.triton.server_args import (
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    RESTRICTED_APIS,
    ServerArgs,
    shell_command,
    tritonserver_args,
)

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_IMAGE", "server_args", "write_deploy_bundle", "gpu_models"]
SCRIPT, COMPOSE, README = "docker-run.sh", "compose.yaml", "README.md"
MULTI_GPU_FIXED_TAG = "25.04"  # the first release whose onnxruntime backend puts each instance's TensorRT EP on its own GPU


def server_args(http_port: int = 8000, grpc_port: int = 8001, metrics_port: int = 8002,
                models: tuple[str, ...] = (), repository: str = CONTAINER_REPOSITORY) -> ServerArgs:
    """How the production server runs: exactly ``models`` loaded at start (explicit model control),
    the admin APIs (load/unload included) behind the key; ``repository`` the mounted folder or an ``s3://`` URL."""
    return ServerArgs(repository=repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                      host=CONTAINER_ADDRESS, model_control="explicit", load_models=tuple(models))


def gpu_models(models: dict[str, Any]) -> list[str]:
    """The models a GPU server loads: every model but those whose instance groups are all ``KIND_CPU``, except the steps
    of an ensemble it loads (a raw-input ensemble decodes images on the CPU)."""
    from tritonclient.grpc.model_config_pb2 import ModelInstanceGroup

    cpu = ModelInstanceGroup.Kind.KIND_CPU
    loaded = {name for name, info in models.items()
              if not (info.config.instance_group and all(g.kind == cpu for g in info.config.instance_group))}
    for name in list(loaded):
        if models[name].config.platform == "ensemble":
            loaded |= {step.model_name for step in models[name].config.ensemble_scheduling.step if step.model_name in models}
    return sorted(loaded)


def unloadable_op_libraries(local: Path, models: dict[str, Any], loaded: list[str]) -> dict[str, str]:
    """The loaded models whose custom-op library Triton's C++ ONNX Runtime backend cannot load (onnxruntime-extensions'
    CPython module from PyPI), with the ensembles that use them: model → why, in one line with the fix."""
    from pipeline.backend.extensions import STANDALONE_HOWTO, python_symbols

    refused = {}
    for name in loaded:
        for library in models[name].config.model_operations.op_library_filename:
            path = Path(library) if Path(library).is_absolute() else Path(local) / library
            if not path.is_file():
                refused[name] = f"its custom-op library {library} is not in the repository — {STANDALONE_HOWTO}"
            elif python_symbols(path):
                refused[name] = (f"its custom-op library {library} is onnxruntime-extensions' CPython module, which the C++ onnxruntime "
                                 f"backend cannot load — {STANDALONE_HOWTO}")
    for name in loaded:
        steps = [step.model_name for step in models[name].config.ensemble_scheduling.step]
        blocked = [step for step in steps if step in refused]
        if blocked:
            refused[name] = f"its step {blocked[0]} is not loaded: {refused[blocked[0]]}"
    return refused


def write_deploy_bundle(
    repository: Path | S3Url,
    out_dir: Path,
    *,
    image: str = DEFAULT_IMAGE,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    quiet: bool = False,
) -> list[Path]:
    """Write ``docker-run.sh``, ``compose.yaml`` and ``README.md`` to ``out_dir`` serving ``repository``.
    ``quiet`` (a build writing it beside the repository): notes for a host with several GPUs go only into the
    bundle's README and the log's info, not the warnings of a build that deploys nothing.

    The repository is referenced relative to ``out_dir`` so bundle and repository can move together.
    Files the user edited are kept (the new version goes to ``<file>.new``). Raises PipelineError if
    a GPU model cannot load in ``image`` (:func:`pipeline.triton.ngc_releases.check_image`) or the
    repository has no GPU model.
    """
    ports = (http_port, grpc_port, metrics_port)
    require(all(1 <= p <= 65535 for p in ports) and len(set(ports)) == 3, f"ports {ports} must be distinct and in 1..65535", "pick three free ports")
    with readable(repository) as local:  # s3://: a copy of what its server serves, read here
        models = read_repository(local)
        loaded = gpu_models(models)
        refused = unloadable_op_libraries(local, models, loaded)
        for name, why in sorted(refused.items()):
            log.warning("deploy bundle: %s is not loaded: %s", name, why)
        loaded = gpu_models({name: info for name, info in models.items() if name not in refused})  # their CPU steps go with them
        libraries = any(models[name].config.model_operations.op_library_filename for name in loaded)
        require(bool(loaded), f"every model in {repository} is CPU-only (KIND_CPU), and this bundle is for a GPU host",
                "build GPU variants (e.g. --fp16), or serve the CPU variants with `python -m pipeline serve`")
        for line in check_image(image, repository_needs(models, loaded)):
            log.warning("not checked: %s", line)
        one_gpu = one_gpu_note(image, models, loaded)
        if one_gpu:
            (log.info if quiet else log.warning)("%s", one_gpu)
        builds = plan_builds(local, models)

    out_dir = Path(out_dir)
    store = bundle_store(repository) if isinstance(repository, S3Url) else None
    require(not (store and builds), f"the plans of {repository} are built at deploy (--plans-at-deploy), which needs a mounted repository",
            "copy the repository to a folder (aws s3 sync) and deploy that")
    rel_repo = None if store else relative_repository(Path(repository), out_dir)  # type: ignore[arg-type]
    tag = ngc_tag(image)
    require(not builds or tag is not None, f"the repository's plans are built at deploy (--plans-at-deploy), and {image} is not an NGC "
            "tritonserver -py3 tag, so the TensorRT container of its release is not known",
            "pass --image an NGC tritonserver tag such as nvcr.io/nvidia/tritonserver:25.01-py3")
    plan_names = [b.plan_model for b in builds]
    server = server_args(http_port, grpc_port, metrics_port, tuple(loaded), repository=store[0] if store else CONTAINER_REPOSITORY)
    if builds:
        server = replace(server, extra_repositories=(CONTAINER_PLANS,), strict_readiness=False)
    setup = cache_setup_shell(loaded)
    if libraries:  # op_library_filename is relative to the repository: dlopen reads it from the working directory
        require(store is None, f"the raw-input ensemble of {repository} ships its custom-op library in the repository, which a server "
                "reading s3:// cannot dlopen", "copy the repository to a folder (aws s3 sync) and deploy that")
        setup = f"cd {CONTAINER_REPOSITORY} && {setup}"
    service = compose_service(image=image, server=server, ports=[(p, p) for p in ports], rel_repo=rel_repo, devices={"count": "all"},
                              setup=setup, object_store=store[1] if store else None, load_plans=bool(builds))
    services = {"plans": plans_service(tag, rel_repo, {"count": "all"}), "triton": with_plans(service)} if builds and tag else {"triton": service}
    skipped = sorted(set(models) - set(loaded))
    pre = docker_run_plans_lines(tag) if builds and tag else []
    serve = shell_command(tritonserver_args(server))
    wheel = polygraphy_wheel() if builds else None
    files: dict[str, str | bytes] = {
        SCRIPT: _docker_run_script(image, rel_repo, f"{setup} && " + (serve_then_load(serve, http_port) if builds else f"exec {serve}"),
                                   ports, pre, s3=store is not None),
        COMPOSE: compose_yaml(services, f"Serve the model repository with {image}: {ADMIN_KEY_ENV}=<secret> docker compose up"),
        README: _readme(image, loaded, skipped, ports, one_gpu, plan_names),
        **({PLANS_SCRIPT: build_plans_script(builds), LOADER: LOADER_SOURCE} if builds else {}),
        **({f"{WHEEL_DIR}/{wheel[0]}": wheel[1]} if wheel else {}),
    }
    if wheel:  # one Polygraphy wheel: an older one left by an earlier deploy would conflict in pip
        for stale in (out_dir / WHEEL_DIR).glob("polygraphy-*.whl"):
            if stale.name != wheel[0]:
                stale.unlink()
    paths = write_bundle_files(out_dir, files, executable=[SCRIPT, PLANS_SCRIPT])
    log.info("deploy bundle for %s (%s) written to %s", repository, image, out_dir)
    log.info("%s", exposure_note())
    return paths


def bundle_store(url: S3Url) -> tuple[str, str]:
    """The URL a bundled server reads ``url`` at (with the endpoint of an S3-compatible store) and the region."""
    from pipeline.core.objectstore import DEFAULT_REGION, endpoint_of, s3_client

    client = s3_client(url)
    return url.triton_url(endpoint_of(client)), str(client.meta.region_name or DEFAULT_REGION)


def one_gpu_note(image: str, models: dict[str, Any], loaded: list[str]) -> str | None:
    """The warning for an NGC image before 25.04 serving ONNX models through ONNX Runtime's TensorRT EP: its
    onnxruntime backend ran every instance's TensorRT EP on GPU 0 (onnxruntime_backend PR #299, in 25.04), so on a
    host with several GPUs the other GPUs' instances compute on GPU 0. None for other images or plan-only repositories."""
    from pipeline.triton.accelerators import gpu_accelerator_parameters

    tag = ngc_tag(image)
    if tag is None or tag >= MULTI_GPU_FIXED_TAG:
        return None
    trt_models = [name for name in loaded if gpu_accelerator_parameters(models[name].config, "tensorrt") is not None]
    if not trt_models:
        return None
    return (f"{image} runs ONNX Runtime's TensorRT EP of every instance on GPU 0 (fixed in {MULTI_GPU_FIXED_TAG}, "
            f"onnxruntime_backend PR #299): on a host with several GPUs, run one container per GPU "
            f"(TRITON_GPUS='\"device=N\"' and its own ports) or use {NGC_REPOSITORY}:{MULTI_GPU_FIXED_TAG}-py3 or newer")


def _docker_run_script(image: str, rel_repo: str | None, server: str, ports: tuple[int, ...], pre: list[str] | None = None,
                       s3: bool = False) -> str:
    publish = " ".join(f'-p "{BIND_ADDRESS}:{p}:{p}"' for p in ports)
    # s3: the server reads the bucket; the AWS variables pass through by name (docker run -e NAME), never written here
    source = [f"-e {name}" for name in (*AWS_SECRETS, "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")] if s3 else \
        ['-v "${MODEL_REPOSITORY}:' + CONTAINER_REPOSITORY + ':ro"']
    docker = [
        "docker run --rm --init",
        '--gpus "${TRITON_GPUS:-all}"',
        f"--user {CONTAINER_USER}",
        "--shm-size=1g --ulimit memlock=-1 --ulimit stack=67108864",
        publish,
        *source,
        *([f'-v "$PLANS_DIR:{CONTAINER_PLANS}:ro"', f'-v "$HERE/{LOADER}:/{LOADER}:ro"'] if pre else []),
        f"-e {ADMIN_KEY_ENV}",
        shlex.quote(image),
        "bash -c " + shlex.quote(server),
    ]
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# Serve the model repository with {image}. Written by the pipeline: edits are kept (a regenerated version goes to docker-run.sh.new).",
        f"# Admin APIs ({', '.join(RESTRICTED_APIS)}) need the header '{ADMIN_HEADER}: ${ADMIN_KEY_ENV}'",
        f"# (gRPC metadata 'triton-grpc-protocol-{ADMIN_HEADER}'). TRITON_GPUS picks GPUs, e.g. '\"device=0\"' or a MIG UUID;",
        "# The server reads the model repository from S3 with the AWS_* credentials of this environment. Ports are published on" if s3
        else "# MODEL_REPOSITORY overrides the repository next to this bundle. Ports are published on",
        f"# {BIND_ENV} (default {DEFAULT_BIND_ADDRESS}); inference and metrics need no key: see README.md.",
        "set -euo pipefail",
        f': "${{{ADMIN_KEY_ENV}:?export {ADMIN_KEY_ENV}=<secret> first: it unlocks the admin APIs}}"',
        *([f': "${{{name}:?export {name} first: the server reads the model repository from S3}}"' for name in AWS_SECRETS] if s3
          else script_repository_lines(rel_repo)),
        *(pre or []),
        "exec " + " \\\n  ".join(docker),
        "",
    ])


def _readme(image: str, models: list[str], skipped: list[str], ports: tuple[int, ...], one_gpu: str | None = None,
            plans: list[str] | None = None) -> str:
    http, grpc, metrics = ports
    cpu_note = [f"Not loaded (CPU-only variants, `KIND_CPU`, for CPU deployments): {', '.join(skipped)}.", ""] if skipped else []
    cpu_note += [f"Several GPUs: {one_gpu}.", ""] if one_gpu else []
    cpu_note += [f"TensorRT plans built here before the server starts ({PLANS_SCRIPT}, in the NGC TensorRT container of the image's "
                 f"release, with its Polygraphy or the one in {WHEEL_DIR}/): {', '.join(plans)}. Each is served only if it matches the "
                 "golden outputs recorded at build time; a plan that fails is named in the init step's log and left out. The server "
                 f"starts with every other model and then loads the plans ({LOADER}, in its own container, through the repository "
                 "API): a plan its TensorRT cannot load is named in one line of the server's log and the other models serve on. "
                 "Readiness is not strict then (`/v2/health/ready`: the server answers; a failed plan would hold a strict one "
                 "at 400): check each model with `/v2/models/<name>/ready`.",
                 ""] if plans else []
    return "\n".join([
        "# Triton deploy bundle",
        "",
        f"Serves {', '.join(models)} with `{image}` on a GPU host (NVIDIA Container Toolkit).",
        "",
        *cpu_note,
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
        "The listed models load at start (`--model-control-mode=explicit`, one `--load-model` each); publish a new build,",
        "then restart: the container empties its TensorRT engine cache at start, so a new version never reuses an old engine.",
        "Files you edit here are kept when the bundle is regenerated: the new version is written beside them as `<file>.new`.",
        "",
    ])
