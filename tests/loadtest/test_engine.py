"""The HTTP engine against a scripted loopback HTTP server (see scripted_server.py for why it is
not Triton): every request the server answered is accounted for, by kind, and every run ends
on time."""

from __future__ import annotations

import socket
import time

import numpy as np

from pipeline.loadtest.client import Endpoint, post_request_bytes
from pipeline.loadtest.engine import HttpEngine
from pipeline.loadtest.policy import ClosedLoop, OpenLoop

from .scripted_server import ScriptedServer


def requests_for(port: int) -> list[bytes]:
    endpoint = Endpoint("127.0.0.1", port)
    return [post_request_bytes(endpoint, "/v2/models/m/infer", b'{"inputs":[]}')]


def run(engine: HttpEngine, seconds: float, drain: float = 1.0) -> float:
    began = time.perf_counter_ns()
    engine.start()
    engine.run_until(began + int(seconds * 1e9))
    engine.finish(drain)
    return (time.perf_counter_ns() - began) / 1e9


def test_closed_loop_counts_every_answer_by_kind() -> None:
    script = lambda n: "error" if n % 5 == 4 else ("close" if n % 11 == 10 else "ok")
    with ScriptedServer(script) as server:
        engine = HttpEngine([(Endpoint("127.0.0.1", server.port), requests_for(server.port))], ClosedLoop(4), timeout_s=2.0)
        run(engine, 0.5)
    r = engine.recorders[0]
    assert server.done["ok"] > 50
    assert len(r.latency_ns) == server.done["ok"]
    assert r.errors["http_503"] == server.done["error"]
    assert r.errors["connection_closed"] == server.done["close"]
    assert r.error_samples["http_503"] == ["busy"]
    assert r.sent == sum(server.done.values()) and r.abandoned == 0


def test_requests_without_answer_time_out_and_the_run_ends_on_time() -> None:
    with ScriptedServer(lambda n: "ok" if n < 3 else "hang") as server:
        engine = HttpEngine([(Endpoint("127.0.0.1", server.port), requests_for(server.port))], ClosedLoop(2), timeout_s=0.2)
        elapsed = run(engine, 0.65, drain=0.1)
    r = engine.recorders[0]
    assert len(r.latency_ns) == 3
    assert r.errors["timeout"] >= 4  # each slot: hang, time out after 0.2 s, reconnect, hang again
    assert elapsed < 1.5


def test_refused_connections_are_counted_with_backoff() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    engine = HttpEngine([(Endpoint("127.0.0.1", port), requests_for(port))], ClosedLoop(8), timeout_s=1.0)
    elapsed = run(engine, 1.0)
    r = engine.recorders[0]
    assert len(r.latency_ns) == 0
    # One attempt per back-off period (10, 20, 50, 100, 200, 500 ms...), not 8 slots spinning.
    assert 3 <= r.errors["connect_refused"] <= 12
    assert elapsed < 1.5


def test_open_loop_sends_on_schedule() -> None:
    with ScriptedServer(lambda n: "ok") as server:
        engine = HttpEngine([(Endpoint("127.0.0.1", server.port), requests_for(server.port))], OpenLoop(200.0), timeout_s=2.0)
        run(engine, 1.0)
    r = engine.recorders[0]
    assert 195 <= r.sent <= 201  # 200/s for 1 s (the first one is due after one gap)
    assert len(r.latency_ns) == r.sent == server.done["ok"]
    lag_ms = np.frombuffer(r.lag_ns, dtype=np.int64) / 1e6
    assert len(lag_ms) == r.sent and np.median(lag_ms) < 2.0


def test_open_loop_latency_counts_from_the_schedule_when_the_server_lags() -> None:
    """One connection allowed, a server that answers in ~20 ms, 200 requests/s offered: requests
    queue in the client's backlog and their latency keeps growing (no coordinated omission)."""

    def slow(n: int) -> str:
        time.sleep(0.02)
        return "ok"

    with ScriptedServer(slow) as server:
        engine = HttpEngine(
            [(Endpoint("127.0.0.1", server.port), requests_for(server.port))], OpenLoop(200.0), timeout_s=5.0, max_connections=1
        )
        run(engine, 1.0, drain=0.0)
    r = engine.recorders[0]
    latency_ms = np.frombuffer(r.latency_ns, dtype=np.int64) / 1e6
    assert len(latency_ms) < 60  # ~50/s served
    assert latency_ms[-1] > 300  # the last served had waited most of the second
    assert engine.unsent[0] > 100  # scheduled, never sent: reported, not silently dropped
