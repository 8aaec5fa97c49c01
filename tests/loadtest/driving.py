"""Driving an engine in a test until something happened, not for a fixed time: on a busy machine a
run of one second may see one event or fifty, so the tests wait for the events they check (bounded
only to fail a test that would hang) and bound counts by what the schedule allows in the time
actually taken (a slow loop only makes fewer)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from pipeline.loadtest.policy import BACKOFF_NS

BACKOFF_MS = tuple(ns / 1e6 for ns in BACKOFF_NS)  # every engine's retry schedule
NEVER_S = 120.0  # a test whose engine has not got there by then hangs: fail it


def run_until_seen(engine: Any, seen: Callable[[], bool]) -> float:
    """Start ``engine`` and run it until ``seen()``; the seconds it took."""
    began = time.perf_counter_ns()
    engine.start()
    while not seen():
        assert time.perf_counter_ns() - began < NEVER_S * 1e9, "the engine never got there"
        engine.run_until(time.perf_counter_ns() + 10_000_000)
    return (time.perf_counter_ns() - began) / 1e9


def retries_within(seconds: float) -> int:
    """How many back-off retries one failing slot can make in ``seconds`` at most."""
    delays = itertools.chain(BACKOFF_MS, itertools.repeat(BACKOFF_MS[-1]))
    elapsed_ms, count = 0.0, 0
    for delay in delays:
        elapsed_ms += delay
        if elapsed_ms > seconds * 1000:
            return count
        count += 1
    raise AssertionError("unreachable")
