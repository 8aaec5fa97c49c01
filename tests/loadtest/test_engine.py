"""The HTTP engine against a scripted loopback HTTP server (see scripted_server.py for why it is
not Triton): every request the server answered is accounted for, by kind, and every run ends
on time.

The assertions hold on a loaded machine: the tests wait for the events they check, and counts are
bounded by what the schedule allows in the time actually taken, never by how fast this machine is
(how promptly the open loop sends is measured by scripts/bench_loadgen.py).
"""

from __future__ import annotations

import socket
import time

import numpy as np

from pipeline.loadtest.client import Endpoint, post_request_bytes
from pipeline.loadtest.engine import HttpEngine
from pipeline.loadtest.policy import ClosedLoop, OpenLoop

from .driving import retries_within, run_until_seen
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
    # every kind among the first requests (the 4 connections send at once), then repeating
    script = lambda n: "error" if n % 5 == 1 else ("close" if n % 7 == 2 else "ok")
    with ScriptedServer(script) as server:
        engine = HttpEngine([(Endpoint("127.0.0.1", server.port), requests_for(server.port))], ClosedLoop(4), timeout_s=30.0)
        run(engine, 0.5, drain=30.0)  # the drain ends when the last answer is in
    r = engine.recorders[0]
    assert server.done["ok"] >= 1 and server.done["error"] >= 1 and server.done["close"] >= 1, server.done
    assert len(r.latency_ns) == server.done["ok"]
    assert r.errors["http_503"] == server.done["error"]
    assert r.errors["connection_closed"] == server.done["close"]
    assert r.error_samples["http_503"] == ["busy"]
    assert r.sent == sum(server.done.values()) and r.abandoned == 0


def test_requests_without_answer_time_out_and_every_one_is_accounted_for() -> None:
    with ScriptedServer(lambda n: "ok" if n < 3 else "hang") as server:
        engine = HttpEngine([(Endpoint("127.0.0.1", server.port), requests_for(server.port))], ClosedLoop(2), timeout_s=0.2)
        r = engine.recorders[0]
        # each slot: hang, time out, reconnect, hang again; the drain ends when the last ones timed out
        run_until_seen(engine, lambda: r.errors.get("timeout", 0) >= 3)
        engine.finish(60.0)
    # An answer slower than the timeout (a busy machine) is a timeout too: answered + timed out = sent.
    assert set(r.errors) == {"timeout"} and r.errors["timeout"] >= 3, r.errors
    assert len(r.latency_ns) <= server.done["ok"] <= 3
    assert r.sent == len(r.latency_ns) + r.errors["timeout"] and r.abandoned == 0 and engine.in_flight == 0


def test_refused_connections_are_counted_with_backoff() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    engine = HttpEngine([(Endpoint("127.0.0.1", port), requests_for(port))], ClosedLoop(8), timeout_s=1.0)
    r = engine.recorders[0]
    seconds = run_until_seen(engine, lambda: r.errors.get("connect_refused", 0) >= 10)
    engine.finish(1.0)
    assert len(r.latency_ns) == 0 and r.sent == 0
    # Up to one attempt per slot at start (before the first refusal comes back), then one attempt
    # per back-off period (10, 20, 50, 100, 200, 500 ms...) for the endpoint, never 8 slots spinning.
    assert 10 <= r.errors["connect_refused"] <= 8 + retries_within(seconds), (r.errors, seconds)
    assert set(r.errors) == {"connect_refused"}


def test_open_loop_sends_on_schedule() -> None:
    with ScriptedServer(lambda n: "ok") as server:
        engine = HttpEngine([(Endpoint("127.0.0.1", server.port), requests_for(server.port))], OpenLoop(200.0), timeout_s=30.0)
        r = engine.recorders[0]
        seconds = run_until_seen(engine, lambda: r.sent >= 20)
        engine.finish(60.0)
    # 200/s, the first one due after one gap: never more than were due in the time taken; a late loop
    # catches up on what was due (sent, or queued and reported unsent).
    assert 20 <= r.sent + engine.unsent[0] <= 200 * seconds + 1, (r.sent, engine.unsent, seconds)
    assert len(r.latency_ns) == r.sent == server.done["ok"]
    lag_ns = np.frombuffer(r.lag_ns, dtype=np.int64)
    assert len(lag_ns) == r.sent and lag_ns.min() >= 0  # every send recorded, none before it was due


def test_open_loop_latency_counts_from_the_schedule_when_the_server_lags() -> None:
    """One connection allowed, a server that answers in ~20 ms, 200 requests/s offered: requests
    queue in the client's backlog and their latency keeps growing (no coordinated omission)."""

    def slow(n: int) -> str:
        time.sleep(0.02)
        return "ok"

    with ScriptedServer(slow) as server:
        engine = HttpEngine(
            [(Endpoint("127.0.0.1", server.port), requests_for(server.port))], OpenLoop(200.0), timeout_s=60.0, max_connections=1
        )
        r = engine.recorders[0]
        run_until_seen(engine, lambda: len(r.latency_ns) >= 10)
        engine.finish(0.0)
    latency_ms = np.frombuffer(r.latency_ns, dtype=np.int64) / 1e6
    # The k-th request (from 0) was due (k + 1) × 5 ms after the start and, one at a time behind
    # answers of at least 20 ms each, answered no earlier than (k + 1) × 20 ms: it waited at least
    # (k + 1) × 15 ms, counted from its schedule, whatever the load (a busy machine only adds).
    floor_ms = 15.0 * np.arange(1, len(latency_ms) + 1)
    assert len(latency_ms) >= 10 and (latency_ms >= floor_ms - 1.0).all(), (latency_ms[:12], floor_ms[:12])
    # scheduled, never sent: reported, not silently dropped
    assert engine.unsent[0] > 0, (r.sent, engine.unsent)
