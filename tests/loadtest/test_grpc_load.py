"""The gRPC engine without a server: failures are counted by kind, with back-off, and the run ends."""

from __future__ import annotations

import socket
import time
from concurrent import futures

import grpc
import pytest

from pipeline.loadtest.client import Endpoint
from pipeline.loadtest.grpc_load import GrpcEngine
from pipeline.loadtest.policy import ClosedLoop


def test_unreachable_grpc_endpoint_counts_unavailable_with_backoff() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    engine = GrpcEngine([(Endpoint("127.0.0.1", port), [b""])], ClosedLoop(4), timeout_s=0.5)
    began = time.perf_counter_ns()
    engine.start()
    engine.run_until(began + 1_000_000_000)
    engine.finish(0.5)
    r = engine.recorders[0]
    assert len(r.latency_ns) == 0
    assert set(r.errors) == {"grpc_unavailable"}
    # every slot fails at least once; each then backs off (10, 20, 50, 100, 200, 500 ms), so at most
    # 8 attempts per slot fit in the second (a late loop only makes fewer)
    assert 4 <= r.errors["grpc_unavailable"] <= 4 * 8
    assert r.errors["grpc_unavailable"] + r.abandoned <= r.sent  # nothing counted that was not sent


def test_loopback_grpc_ignores_http_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """gRPC core follows http_proxy even for 127.0.0.1; the load generator must talk to the server directly.

    The server is grpcio's own, answering ModelInfer with empty bytes (the engine only times responses)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: b"")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # loopback discard port, nothing answers: any use of it fails the requests
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    try:
        engine = GrpcEngine([(Endpoint("127.0.0.1", port), [b""])], ClosedLoop(2), timeout_s=30.0)
        began = time.perf_counter_ns()
        engine.start()
        engine.run_until(began + 300_000_000)
        engine.finish(30.0)
    finally:
        server.stop(None)
    r = engine.recorders[0]
    assert r.errors == {} and len(r.latency_ns) >= 2 and r.abandoned == 0, r.error_samples
