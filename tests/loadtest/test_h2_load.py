"""The HTTP/2 gRPC engine against a real gRPC server (grpcio's, serving ModelInfer as raw bytes):
responses and errors by status, flow control both ways with messages far larger than the
windows, timeouts, a server that goes away, and an endpoint where nothing listens. Counts are
exact (every request sent is answered, failed, or abandoned); no assertion depends on timing."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from pipeline.loadtest.client import Endpoint
from pipeline.loadtest.h2_frames import all_indexed, hpack_string
from pipeline.loadtest.h2_load import H2GrpcEngine
from pipeline.loadtest.policy import ClosedLoop, OpenLoop, Policy


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[bytes, Any], bytes]], tuple[Endpoint, grpc.Server]]]:
    servers: list[grpc.Server] = []

    def start(handler: Callable[[bytes, Any], bytes]) -> tuple[Endpoint, grpc.Server]:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)])
        method = grpc.unary_unary_rpc_method_handler(handler)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": method}),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return Endpoint("127.0.0.1", port), server

    yield start
    for s in servers:
        s.stop(None)


def run(endpoint: Endpoint, payloads: list[bytes], policy: Policy, *, until: Callable[[H2GrpcEngine], bool], timeout_s: float = 30.0) -> H2GrpcEngine:
    """Run until ``until(engine)`` holds (checked every 10 ms; a generous bound only against a hang), then finish."""
    engine = H2GrpcEngine([(endpoint, payloads)], policy, timeout_s=timeout_s)
    engine.start()
    bound = time.perf_counter_ns() + 60_000_000_000
    while not until(engine) and time.perf_counter_ns() < bound:
        engine.run_until(time.perf_counter_ns() + 10_000_000)
    engine.finish(30.0)
    return engine


def test_responses_are_counted_and_every_request_is_accounted_for(serve: Callable) -> None:
    seen: list[bytes] = []
    endpoint, _ = serve(lambda request, context: seen.append(request) or b"ok")
    engine = run(endpoint, [b"first", b"second"], ClosedLoop(4), until=lambda e: len(e.recorders[0].latency_ns) >= 200)
    r = engine.recorders[0]
    assert r.errors == {} and r.abandoned == 0
    assert len(r.latency_ns) == r.sent == len(seen)  # finish drained every stream
    assert set(seen) == {b"first", b"second"}  # the serialized requests, byte for byte, in turn


def test_messages_larger_than_every_window_go_both_ways(serve: Callable) -> None:
    big = bytes(range(256)) * 12_000  # 3 MB: 47 × the initial 64 KiB window, 188 × the 16 KiB frame
    endpoint, _ = serve(lambda request, context: request if request == big else b"corrupted")
    engine = run(endpoint, [big], ClosedLoop(3), until=lambda e: len(e.recorders[0].latency_ns) >= 12)
    r = engine.recorders[0]
    assert r.errors == {} and len(r.latency_ns) == r.sent >= 12, r.error_samples  # the server saw every byte intact


@pytest.mark.parametrize(("code", "kind"), [(grpc.StatusCode.INVALID_ARGUMENT, "grpc_invalid_argument"), (grpc.StatusCode.UNAVAILABLE, "grpc_unavailable")])
def test_a_failed_call_is_counted_by_its_status_with_the_servers_message(serve: Callable, code: grpc.StatusCode, kind: str) -> None:
    endpoint, _ = serve(lambda request, context: context.abort(code, "model 'nope' is not found"))
    engine = run(endpoint, [b"x"], ClosedLoop(2), until=lambda e: e.recorders[0].error_count >= 10)
    r = engine.recorders[0]
    assert set(r.errors) == {kind} and not r.latency_ns
    assert r.error_samples[kind] == ["model 'nope' is not found"]
    assert r.errors[kind] + r.abandoned == r.sent


def test_a_request_without_answer_times_out_and_its_stream_is_reset(serve: Callable) -> None:
    release = threading.Event()
    endpoint, _ = serve(lambda request, context: release.wait(30) and b"late")
    try:
        engine = run(endpoint, [b"x"], ClosedLoop(1), until=lambda e: e.recorders[0].error_count >= 2, timeout_s=0.2)
    finally:
        release.set()
    r = engine.recorders[0]
    assert set(r.errors) == {"timeout"} and r.errors["timeout"] >= 2 and not r.latency_ns


def test_a_server_that_stops_fails_the_streams_and_the_engine_reconnects_when_it_is_back(serve: Callable) -> None:
    endpoint, server = serve(lambda request, context: b"ok")
    engine = H2GrpcEngine([(endpoint, [b"x"])], ClosedLoop(2), timeout_s=5.0)
    engine.start()
    while len(engine.recorders[0].latency_ns) < 50:
        engine.run_until(time.perf_counter_ns() + 10_000_000)
    server.stop(None)  # GOAWAY, then the connection closes; a call in flight then ends CANCELLED ("Cancelling all calls")
    while not engine.recorders[0].error_count:
        engine.run_until(time.perf_counter_ns() + 10_000_000)
    engine.finish(5.0)
    r = engine.recorders[0]
    assert len(r.latency_ns) >= 50 and set(r.errors) <= {"grpc_goaway", "grpc_cancelled", "connection_closed", "connection_reset", "connect_refused",
                                                   "grpc_unavailable"}, r.errors
    assert len(r.latency_ns) + r.error_count + r.abandoned >= r.sent


def test_nothing_listening_gives_refused_connects_with_back_off() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    engine = H2GrpcEngine([(Endpoint("127.0.0.1", port), [b"x"])], ClosedLoop(4), timeout_s=1.0)
    engine.start()
    while engine.recorders[0].error_count < 3:
        engine.run_until(time.perf_counter_ns() + 10_000_000)
    engine.finish(0.5)
    r = engine.recorders[0]
    assert set(r.errors) == {"connect_refused"} and r.sent == 0  # one connection per endpoint: a refusal is one error, not four


def test_open_loop_sends_on_schedule_and_reports_the_lag(serve: Callable) -> None:
    endpoint, _ = serve(lambda request, context: b"ok")
    engine = run(endpoint, [b"x"], OpenLoop(200), until=lambda e: len(e.recorders[0].latency_ns) >= 100)
    r = engine.recorders[0]
    assert r.errors == {} and len(r.lag_ns) == r.sent and all(lag >= 0 for lag in r.lag_ns)


def test_hpack_helpers() -> None:
    assert hpack_string(b"te") == b"\x02te" and hpack_string(b"x" * 200)[:2] == bytes((127, 73))
    assert all_indexed(b"\x88\xbe\xc0") and not all_indexed(b"\x88\x40\x01a\x01b")
    assert all_indexed(b"\xff\x81\x01")  # a multi-byte index
