"""The gRPC engine without a server: failures are counted by kind, with back-off, and the run ends.
The tests wait for the events they check (tests/loadtest/driving.py), so a busy machine cannot fail them."""

from __future__ import annotations

import socket
from concurrent import futures

import grpc
import pytest

from pipeline.loadtest.client import Endpoint
from pipeline.loadtest.grpc_load import GrpcEngine
from pipeline.loadtest.policy import ClosedLoop

from .driving import retries_within, run_until_seen


def test_unreachable_grpc_endpoint_counts_unavailable_with_backoff() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    engine = GrpcEngine([(Endpoint("127.0.0.1", port), [b""])], ClosedLoop(4), timeout_s=60.0)
    r = engine.recorders[0]
    seconds = run_until_seen(engine, lambda: r.errors.get("grpc_unavailable", 0) >= 8)
    engine.finish(60.0)  # the retries in flight fail too; the drain ends with the last
    assert len(r.latency_ns) == 0
    assert set(r.errors) == {"grpc_unavailable"}
    # every slot fails, then backs off (10, 20, 50, 100, 200, 500 ms): at most one attempt at start
    # and one per back-off period per slot in the time taken (a late loop only makes fewer)
    assert 8 <= r.errors["grpc_unavailable"] <= 4 * (1 + retries_within(seconds)), (r.errors, seconds)
    assert r.errors["grpc_unavailable"] + r.abandoned == r.sent  # every attempt counted once


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
        engine = GrpcEngine([(Endpoint("127.0.0.1", port), [b""])], ClosedLoop(2), timeout_s=60.0)
        r = engine.recorders[0]
        run_until_seen(engine, lambda: len(r.latency_ns) + sum(r.errors.values()) >= 2)
        engine.finish(60.0)
    finally:
        server.stop(None)
    r = engine.recorders[0]
    assert r.errors == {} and len(r.latency_ns) >= 2 and r.abandoned == 0, r.error_samples
