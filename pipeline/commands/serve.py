"""`python -m pipeline serve`: the embedded tritonserver on the model repository, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from pipeline.core.errors import PipelineError, require
from pipeline.core.objectstore import S3Url
from pipeline.core.options import add_options, at_least, checked_config, option, port_option, repository_option
from pipeline.triton.server import MODEL_CONTROL_MODES, TritonServer
from pipeline.triton.server_args import ADMIN_HEADER, ADMIN_KEY_ENV
from pipeline.triton.supervisor import RESTART_BACKOFF_S, Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeConfig:
    """Every ``serve`` option."""

    repository: Path | S3Url = repository_option()
    host: str = option("127.0.0.1", "address to bind; anything but loopback exposes unauthenticated endpoints")
    http_port: int = port_option(8000, "HTTP/REST")
    grpc_port: int = port_option(8001, "gRPC")
    metrics_port: int = port_option(8002, "Prometheus metrics")
    workdir: Path = option(Path("build"), "where the server log goes: <workdir>/triton/", metavar="DIR")
    log_file: Path | None = option(None, "tritonserver log (default: <workdir>/triton/tritonserver-<http-port>.log; "
                                         "with --slices, one per slice)", metavar="FILE")
    slices: int = option(1, "local MIG rehearsal: N servers on consecutive port triples (http+3i, grpc+3i, metrics+3i), "
                            "each pinned to its share of the CPU cores", metavar="N", check=at_least(1), fix="use --slices 1 for one server")
    model_config_name: str | None = option(None, "load <model>/configs/NAME.pbtxt where present instead of config.pbtxt", metavar="NAME")
    timeout: float = option(120.0, "seconds to wait for readiness", metavar="SECONDS",
                            check=lambda v: None if math.isfinite(v) and v > 0 else "is not a positive number of seconds")
    model_control: str = option("none", "explicit: every model still loads at start, and the repository API may load, unload or "
                                        "reload models with a config override (what `tune --url` needs)", choices=MODEL_CONTROL_MODES)
    restricted_api: bool = option(False, f"restrict the admin APIs (model repository, model config, ...) to requests with the header "
                                         f"'{ADMIN_HEADER}: ${ADMIN_KEY_ENV}', as the production launch scripts do")


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """The checked ServeConfig of a parsed command line (one-line PipelineError on a bad value)."""
    cfg = checked_config(ServeConfig, args)
    return cfg


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
            "prints the endpoints, and runs until Ctrl-C or SIGTERM, then stops cleanly. A server that dies is "
            "logged with its cause (exit status or signal, last log lines) and restarted on the same ports after "
            f"{', '.join(f'{d:g}' for d in RESTART_BACKOFF_S)} s (the last repeating) while it keeps crashing; "
            "readiness says no until it is back."
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
    add_options(p, ServeConfig)
    p.set_defaults(handler=run)


def _admin_key(cfg: ServeConfig) -> str | None:
    """The admin key of --restricted-api (from the environment, never the command line)."""
    if not cfg.restricted_api:
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


def _servers(cfg: ServeConfig) -> list[TritonServer]:
    admin_key = _admin_key(cfg)
    if cfg.slices == 1:
        return [TritonServer(cfg.repository, host=cfg.host, http_port=cfg.http_port, grpc_port=cfg.grpc_port,
                             metrics_port=cfg.metrics_port, log_path=cfg.log_file, workdir=cfg.workdir,
                             model_config_name=cfg.model_config_name,
                             model_control=cfg.model_control, admin_key=admin_key)]
    cpus = sorted(os.sched_getaffinity(0))
    if cfg.slices > len(cpus):
        log.warning("%d slices on %d cores: slices share cores, so throughput per slice is not representative",
                    cfg.slices, len(cpus))
    servers = []
    for i, share in enumerate(cpu_shares(cpus, cfg.slices)):
        log_path = cfg.log_file.with_name(f"{cfg.log_file.stem}-slice{i}{cfg.log_file.suffix}") if cfg.log_file else None
        servers.append(TritonServer(
            cfg.repository, host=cfg.host, http_port=_slice_port(cfg.http_port, i),
            grpc_port=_slice_port(cfg.grpc_port, i), metrics_port=_slice_port(cfg.metrics_port, i),
            log_path=log_path, workdir=cfg.workdir, cpus=share, model_config_name=cfg.model_config_name,
            model_control=cfg.model_control, admin_key=admin_key,
        ))
    return servers


def run(args: argparse.Namespace) -> int:
    """Start the server(s), log the endpoints, block until Ctrl-C/SIGTERM; 0 after a clean shutdown."""
    cfg = config_from_args(args)
    stop = threading.Event()
    received: list[str] = []
    starting = [True]

    servers = _servers(cfg)
    supervisor = Supervisor(servers, stop, start_timeout=cfg.timeout)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()
        if starting[0] or supervisor.restarting:
            raise KeyboardInterrupt  # abort a (re)start that may wait for minutes; start() cleans up

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            for i, server in enumerate(servers):
                server.start(timeout=cfg.timeout)
                where = f"slice {i} (CPUs {server.cpus})" if len(servers) > 1 else "tritonserver"
                log.info("%s serving %s: http=%s grpc=%s metrics=%s models=%s log=%s",
                         where, cfg.repository, server.http_url, server.grpc_url, server.metrics_url,
                         ", ".join(server.ready_models), server.log_path)
            starting[0] = False
        except KeyboardInterrupt:
            if not received:
                raise
        if not stop.is_set():
            log.info("ready; Ctrl-C or SIGTERM stops %s", "the servers" if len(servers) > 1 else "the server")
        try:
            supervisor.watch()  # a server that dies is logged with its cause and restarted
        except KeyboardInterrupt:
            if not received:
                raise
        log.info("%s received; stopping", received[0])
    finally:
        starting[0] = False
        for server in servers:
            server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
