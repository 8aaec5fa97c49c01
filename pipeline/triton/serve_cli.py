"""`python -m pipeline serve`: the embedded tritonserver on the model repository, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType

from pipeline.argtypes import port
from pipeline.errors import PipelineError, require
from pipeline.triton.server_args import ADMIN_HEADER, ADMIN_KEY_ENV
from pipeline.triton.server import MODEL_CONTROL_MODES, TritonServer

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``serve`` command."""
    p = subparsers.add_parser(
        "serve",
        help="serve the Triton model repository on CPU with the embedded tritonserver",
        description=(
            "Start the real tritonserver (2.51, from the nvidia-pytriton wheel) on the model repository. "
            "ONNX models (platform onnxruntime_onnx) are served by a Python-based 'onnxruntime' backend, so "
            "the repository loads unchanged; TensorRT plans need a GPU and are skipped with a reason. "
            "Endpoints bind to 127.0.0.1 unless --host says otherwise. Waits until every model is ready, "
            "prints the endpoints, and runs until Ctrl-C or SIGTERM, then stops cleanly."
        ),
        epilog=(
            "examples:\n"
            "  python -m pipeline serve                     # model_repository/ on 127.0.0.1:8000/8001/8002\n"
            "  python -m pipeline serve --http-port 0 --grpc-port 0 --metrics-port 0  # free ports\n"
            "  python -m pipeline serve --slices 2          # 2 servers, each pinned to half the cores\n"
            "  curl -s localhost:8000/v2/models/digits_fp32 # model metadata\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repository", type=Path, default=Path("model_repository"),
                   help="the Triton model repository (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; anything but loopback exposes unauthenticated endpoints (default: %(default)s)")
    p.add_argument("--http-port", type=port, default=8000, help="HTTP/REST port, 0 = any free port (default: %(default)s)")
    p.add_argument("--grpc-port", type=port, default=8001, help="gRPC port, 0 = any free port (default: %(default)s)")
    p.add_argument("--metrics-port", type=port, default=8002,
                   help="Prometheus metrics port, 0 = any free port (default: %(default)s)")
    p.add_argument("--workdir", type=Path, default=Path("build"),
                   help="where the server log goes: <workdir>/triton/ (default: %(default)s)")
    p.add_argument("--log-file", type=Path,
                   help="tritonserver log (default: <workdir>/triton/tritonserver-<http-port>.log; with --slices, one per slice)")
    p.add_argument("--slices", type=int, default=1, metavar="N",
                   help="local MIG rehearsal: N servers on consecutive port triples (http+3i, grpc+3i, "
                        "metrics+3i), each pinned to its share of the CPU cores (default: %(default)s)")
    p.add_argument("--model-config-name", metavar="NAME",
                   help="load <model>/configs/NAME.pbtxt where present instead of config.pbtxt")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness (default: %(default)s)")
    p.add_argument("--model-control", choices=MODEL_CONTROL_MODES, default="none",
                   help="explicit: every model still loads at start, and the repository API may load, unload or "
                        "reload models with a config override (what `tune --url` needs) (default: %(default)s)")
    p.add_argument("--restricted-api", action="store_true",
                   help=f"restrict the admin APIs (model repository, model config, ...) to requests with the header "
                        f"'{ADMIN_HEADER}: ${ADMIN_KEY_ENV}', as the production launch scripts do")
    p.set_defaults(handler=run)


def _admin_key(args: argparse.Namespace) -> str | None:
    """The admin key of --restricted-api (from the environment, never the command line)."""
    if not args.restricted_api:
        return None
    key = os.environ.get(ADMIN_KEY_ENV, "")
    require(bool(key.strip()), f"--restricted-api needs the admin key in ${ADMIN_KEY_ENV}",
            f"export {ADMIN_KEY_ENV}=$(openssl rand -hex 32)")
    return key


def cpu_shares(cpus: list[int], slices: int) -> list[list[int]]:
    """Split ``cpus`` into ``slices`` contiguous shares; with fewer cores than slices, slices share cores."""
    if slices <= len(cpus):
        base, extra = divmod(len(cpus), slices)
        shares, start = [], 0
        for i in range(slices):
            size = base + (1 if i < extra else 0)
            shares.append(cpus[start : start + size])
            start += size
        return shares
    return [[cpus[i % len(cpus)]] for i in range(slices)]


def _slice_port(port: int, index: int) -> int:
    return port + 3 * index if port else 0


def _servers(args: argparse.Namespace) -> list[TritonServer]:
    require(args.slices >= 1, f"--slices must be at least 1, got {args.slices}", "use --slices 1 for one server")
    if args.slices == 1:
        return [TritonServer(args.repository, host=args.host, http_port=args.http_port, grpc_port=args.grpc_port,
                             metrics_port=args.metrics_port, log_path=args.log_file, workdir=args.workdir,
                             model_config_name=args.model_config_name,
                             model_control=args.model_control, admin_key=_admin_key(args))]
    cpus = sorted(os.sched_getaffinity(0))
    if args.slices > len(cpus):
        log.warning("%d slices on %d cores: slices share cores, so throughput per slice is not representative",
                    args.slices, len(cpus))
    servers = []
    for i, share in enumerate(cpu_shares(cpus, args.slices)):
        log_path = args.log_file.with_name(f"{args.log_file.stem}-slice{i}{args.log_file.suffix}") if args.log_file else None
        servers.append(TritonServer(
            args.repository, host=args.host, http_port=_slice_port(args.http_port, i),
            grpc_port=_slice_port(args.grpc_port, i), metrics_port=_slice_port(args.metrics_port, i),
            log_path=log_path, workdir=args.workdir, cpus=share, model_config_name=args.model_config_name,
            model_control=args.model_control, admin_key=_admin_key(args),
        ))
    return servers


def run(args: argparse.Namespace) -> int:
    """Start the server(s), log the endpoints, block until Ctrl-C/SIGTERM; 0 after a clean shutdown."""
    stop = threading.Event()
    received: list[str] = []
    starting = [True]

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()
        if starting[0]:
            raise KeyboardInterrupt  # abort a startup that may wait for minutes; start() cleans up

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    servers = _servers(args)
    try:
        try:
            for i, server in enumerate(servers):
                server.start(timeout=args.timeout)
                where = f"slice {i} (CPUs {server.cpus})" if len(servers) > 1 else "tritonserver"
                log.info("%s serving %s: http=%s grpc=%s metrics=%s models=%s log=%s",
                         where, args.repository, server.http_url, server.grpc_url, server.metrics_url,
                         ", ".join(server.ready_models), server.log_path)
            starting[0] = False
        except KeyboardInterrupt:
            if not received:
                raise
        if not stop.is_set():
            log.info("ready; Ctrl-C or SIGTERM stops %s", "the servers" if len(servers) > 1 else "the server")
        while not stop.wait(1.0):
            dead = [s for s in servers if not s.is_running()]
            if dead:
                raise PipelineError(
                    f"tritonserver on {dead[0].http_url} exited unexpectedly",
                    f"see its log: {dead[0].log_path}",
                )
        log.info("%s received; stopping", received[0])
    finally:
        starting[0] = False
        for server in servers:
            server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
