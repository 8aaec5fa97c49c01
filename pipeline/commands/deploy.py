"""`python -m pipeline deploy`: write the production bundle (docker-run.sh, compose.yaml, README) for a repository."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.objectstore import S3Url
from pipeline.core.options import add_options, checked_config, option, port_option, repository_option
from pipeline.triton.deploy import DEFAULT_IMAGE, SCRIPT, write_deploy_bundle
from pipeline.triton.ngc_releases import ngc_image
from pipeline.triton.server_args import ADMIN_HEADER, ADMIN_KEY_ENV, RESTRICTED_APIS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeployConfig:
    """Every ``deploy`` option."""

    repository: Path | S3Url = repository_option()
    out: Path = option(Path("deploy"), "where to write the bundle", metavar="DIR")
    image: str = option(DEFAULT_IMAGE, "tritonserver image, used exactly as given (a custom registry, an @sha256: digest); "
                               "a bare NGC tag such as 25.01-py3 names the NGC image", metavar="IMAGE")
    http_port: int = port_option(8000, "HTTP/REST", published=True)
    grpc_port: int = port_option(8001, "gRPC", published=True)
    metrics_port: int = port_option(8002, "Prometheus metrics", published=True)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``deploy`` command."""
    p = subparsers.add_parser(
        "deploy",
        help="write docker-run.sh and compose.yaml that serve the model repository with NGC Triton on a GPU host",
        description=(
            "Write a production bundle for the model repository: docker-run.sh (docker run --gpus ...), compose.yaml "
            "and a README. The server loads the GPU models at start (--model-control-mode=explicit, one --load-model "
            "each; CPU-only variants such as *_int8cpu are left to CPU deployments), mounts the repository "
            f"read-only, runs as a non-root user, and restricts the admin APIs ({', '.join(RESTRICTED_APIS)}) to "
            f"requests with the header '{ADMIN_HEADER}: ${ADMIN_KEY_ENV}'; the key comes from the environment "
            f"when the bundle runs and is never written to disk. The default image ({DEFAULT_IMAGE}) is the same Triton "
            "(2.51) as `python -m pipeline serve`; --image is checked against the NGC release table (older than 24.10: "
            "refused; a listed tag: every model's ONNX IR version/opset and plan TensorRT; others: a warning says what "
            "was not checked)."
        ),
        epilog=(
            "examples:\n"
            "  python -m pipeline deploy                                   # model_repository/ -> deploy/\n"
            "  python -m pipeline deploy --image nvcr.io/nvidia/tritonserver:25.01-py3\n"
            f"  {ADMIN_KEY_ENV}=$(openssl rand -hex 32) deploy/docker-run.sh\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, DeployConfig)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``python -m pipeline deploy``: write the bundle and log where it is."""
    cfg = checked_config(DeployConfig, args)
    paths = write_deploy_bundle(cfg.repository, cfg.out, image=ngc_image(cfg.image), http_port=cfg.http_port, grpc_port=cfg.grpc_port, metrics_port=cfg.metrics_port)
    for path in paths:
        log.info("wrote %s", path)
    log.info("start it with: %s=<secret> %s", ADMIN_KEY_ENV, cfg.out / SCRIPT)
    return 0
