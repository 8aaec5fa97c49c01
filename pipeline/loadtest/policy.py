"""Load policies: how many requests are in flight (closed loop) or when each one is due (open loop).

A closed loop keeps ``concurrency`` requests outstanding: a new one leaves as soon as one returns,
so the offered load adapts to the server. An open loop sends at a fixed *request rate* whatever
the server does, and each latency counts from the request's scheduled time — when the server
falls behind, the waiting shows up in the latency instead of being hidden by a slowed-down
client (no coordinated omission).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pipeline.core.errors import PipelineError

ARRIVALS = ("constant", "poisson")


@dataclass(frozen=True)
class ClosedLoop:
    """Keep ``concurrency`` requests in flight per endpoint."""

    concurrency: int

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}"

    @property
    def kind(self) -> str:
        return "concurrency"

    @property
    def value(self) -> float:
        return float(self.concurrency)


@dataclass(frozen=True)
class OpenLoop:
    """Send ``rate`` requests per second per endpoint, evenly spaced or as a Poisson process."""

    rate: float
    arrivals: str = "constant"
    seed: int = 0

    @property
    def label(self) -> str:
        return f"{self.rate:g} req/s ({self.arrivals})"

    @property
    def kind(self) -> str:
        return "request_rate"

    @property
    def value(self) -> float:
        return self.rate

    def gaps_ns(self, chunk: int = 4096) -> Iterator[int]:
        """Endless gaps between consecutive scheduled sends, in nanoseconds."""
        mean = 1e9 / self.rate
        if self.arrivals == "constant":
            # Accumulate in float so that a rate like 3/s does not drift by rounding every gap.
            t = 0.0
            last = 0
            while True:
                t += mean
                now = round(t)
                yield now - last
                last = now
        rng = np.random.default_rng(self.seed)
        while True:
            yield from rng.exponential(mean, chunk).round().astype(np.int64).tolist()


@dataclass(frozen=True)
class Issued:
    """Send what another component issues, when it issues it (MLPerf's LoadGen: pipeline/loadtest/loadgen/); the
    engine keeps no schedule and no concurrency of its own, and opens up to ``max_connections`` as the backlog needs."""

    scenario: str

    @property
    def label(self) -> str:
        return f"LoadGen {self.scenario}"

    @property
    def kind(self) -> str:
        return "loadgen"

    @property
    def value(self) -> float:
        return 0.0


Policy = ClosedLoop | OpenLoop  # a point of a sweep; Issued drives a LoadGen run, not a point


def schedule_ns(policy: OpenLoop, start_ns: int, count: int) -> list[int]:
    """The first ``count`` scheduled send times of an open loop starting at ``start_ns``."""
    out, t = [], start_ns
    gaps = policy.gaps_ns()
    for _ in range(count):
        t += next(gaps)
        out.append(t)
    return out


def split(policy: Policy, parts: int) -> list[Policy | None]:
    """``policy`` shared by ``parts`` load generators (worker processes or pods).

    A closed loop splits its concurrency (``None`` for a worker left without any); an open loop
    splits its rate, each part with its own seed so that the Poisson schedules are independent
    (their sum is again a Poisson process of the whole rate)."""
    if isinstance(policy, ClosedLoop):
        base, extra = divmod(policy.concurrency, parts)
        counts = [base + (1 if i < extra else 0) for i in range(parts)]
        return [ClosedLoop(c) if c else None for c in counts]
    return [OpenLoop(policy.rate / parts, policy.arrivals, policy.seed * parts + i) for i in range(parts)]


def _numbers(text: str, option: str, kind: type) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise PipelineError(f"{option} '{text}' is not a comma-separated list of positive numbers", f"e.g. {option} 1,2,4,8")
    return values


def policies_from_options(concurrency: str | None, request_rate: str | None, arrivals: str, seed: int = 0) -> list[Policy]:
    """The sweep to run: closed-loop concurrencies, or open-loop request rates when a rate is given."""
    if concurrency and request_rate:
        raise PipelineError(
            "--concurrency and --request-rate are two different load policies", "pass one of them, not both"
        )
    if arrivals not in ARRIVALS:
        raise PipelineError(f"unknown --arrivals '{arrivals}'", f"use one of: {', '.join(ARRIVALS)}")
    if request_rate:
        return [OpenLoop(r, arrivals, seed) for r in _numbers(request_rate, "--request-rate", float)]
    return [ClosedLoop(c) for c in _numbers(concurrency or "1,2,4,8,16,32", "--concurrency", int)]


BACKOFF_NS = (10_000_000, 20_000_000, 50_000_000, 100_000_000, 200_000_000, 500_000_000)  # every engine's retry schedule


def backoff_ns(failures: int) -> int:
    """How long to wait before the next connect (or closed-loop re-send) after ``failures`` (≥ 1) failures in a row."""
    return BACKOFF_NS[min(failures, len(BACKOFF_NS)) - 1]
