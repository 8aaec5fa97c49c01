"""`python -m pipeline deploy`: write the production bundle (docker-run.sh, compose.yaml, README) for a repository."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from pipeline.argtypes import port
from pipeline.triton.deploy import DEFAULT_IMAGE, SCRIPT, write_deploy_bundle
from pipeline.triton.server_args import ADMIN_HEADER, ADMIN_KEY_ENV, RESTRICTED_APIS

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``deploy`` command."""
    p = subparsers.add_parser(
        "deploy",
        help="write docker-run.sh and compose.yaml that serve the model repository with NGC Triton on a GPU host",
        description=(
            "Write a production bundle for the model repository: docker-run.sh (docker run --gpus ...), compose.yaml "
            f"and a README. The server loads the repository once at start (--model-control-mode=none), mounts it "
            f"read-only, runs as a non-root user, and restricts the admin APIs ({', '.join(RESTRICTED_APIS)}) to "
            f"requests with the header '{ADMIN_HEADER}: ${ADMIN_KEY_ENV}'; the key comes from the environment "
            f"when the bundle runs and is never written to disk. The default image ({DEFAULT_IMAGE}) is the same Triton "
            "(2.51) as `python -m pipeline serve`; repositories with TensorRT plans need --image with the NGC tag "
            "whose TensorRT built the plans."
        ),
        epilog=(
            "examples:\n"
            "  python -m pipeline deploy                                   # model_repository/ -> deploy/\n"
            "  python -m pipeline deploy --image nvcr.io/nvidia/tritonserver:25.01-py3\n"
            f"  {ADMIN_KEY_ENV}=$(openssl rand -hex 32) deploy/docker-run.sh\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repository", type=Path, default=Path("model_repository"), help="the Triton model repository (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("deploy"), help="where to write the bundle (default: %(default)s)")
    p.add_argument("--image", default=DEFAULT_IMAGE, help="tritonserver image (default: %(default)s)")
    p.add_argument("--http-port", type=port, default=8000, help="HTTP/REST port on host and in the container (default: %(default)s)")
    p.add_argument("--grpc-port", type=port, default=8001, help="gRPC port (default: %(default)s)")
    p.add_argument("--metrics-port", type=port, default=8002, help="Prometheus metrics port (default: %(default)s)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``python -m pipeline deploy``: write the bundle and log where it is."""
    paths = write_deploy_bundle(args.repository, args.out, image=args.image, http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)
    for path in paths:
        log.info("wrote %s", path)
    log.info("start it with: %s=<secret> %s", ADMIN_KEY_ENV, Path(args.out) / SCRIPT)
    return 0
