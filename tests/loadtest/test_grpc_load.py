"""The gRPC engine without a server: failures are counted by kind, with back-off, and the run ends."""

from __future__ import annotations

import socket
import time

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
    assert r.sent == r.errors["grpc_unavailable"] + r.abandoned  # every request accounted for
