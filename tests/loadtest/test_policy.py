"""Load policies: open-loop schedules and option parsing."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.loadtest.policy import (
    ClosedLoop,
    OpenLoop,
    policies_from_options,
    schedule_ns,
    split,
)


def test_constant_schedule_is_exact_without_drift() -> None:
    times = schedule_ns(OpenLoop(3.0), start_ns=1_000, count=3000)
    gaps = np.diff([1_000, *times])
    assert set(gaps.tolist()) <= {333_333_333, 333_333_334}
    assert times[-1] - 1_000 == 1_000_000_000_000  # 3000 requests at 3/s end exactly at 1000 s


def test_poisson_schedule_has_the_rate_and_is_seeded() -> None:
    policy = OpenLoop(1000.0, "poisson", seed=7)
    times = np.array(schedule_ns(policy, 0, 20_000))
    gaps = np.diff(np.concatenate([[0], times]))
    assert abs(gaps.mean() - 1e6) < 0.03e6  # mean gap 1 ms
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # exponential: coefficient of variation 1
    assert schedule_ns(policy, 0, 100) == schedule_ns(OpenLoop(1000.0, "poisson", seed=7), 0, 100)
    assert schedule_ns(policy, 0, 100) != schedule_ns(OpenLoop(1000.0, "poisson", seed=8), 0, 100)


def test_options_make_a_sweep() -> None:
    assert policies_from_options(None, None, "constant") == [ClosedLoop(c) for c in (1, 2, 4, 8, 16, 32)]
    assert policies_from_options("1,8", None, "constant") == [ClosedLoop(1), ClosedLoop(8)]
    assert policies_from_options(None, "50,100.5", "poisson", seed=3) == [OpenLoop(50, "poisson", 3), OpenLoop(100.5, "poisson", 3)]


@pytest.mark.parametrize(
    ("concurrency", "rate", "arrivals", "problem"),
    [("0,2", None, "constant", "--concurrency '0,2' is not a comma-separated list of positive numbers"),
     ("a", None, "constant", "--concurrency 'a' is not a comma-separated list of positive numbers"),
     (None, "-5", "constant", "--request-rate '-5' is not a comma-separated list of positive numbers"),
     ("2", "10", "constant", "--concurrency and --request-rate are two different load policies"),
     (None, "10", "bursty", "unknown --arrivals 'bursty'")],
)  # fmt: skip
def test_bad_options_are_user_errors(concurrency: str | None, rate: str | None, arrivals: str, problem: str) -> None:
    with pytest.raises(PipelineError, match=f"^{re.escape(problem)} — "):
        policies_from_options(concurrency, rate, arrivals)


def test_split_shares_the_load_exactly() -> None:
    assert split(ClosedLoop(5), 2) == [ClosedLoop(3), ClosedLoop(2)]
    assert split(ClosedLoop(1), 2) == [ClosedLoop(1), None]
    shares = split(OpenLoop(300, "poisson", seed=4), 3)
    assert [s.rate for s in shares] == [100, 100, 100] and len({s.seed for s in shares}) == 3  # type: ignore[union-attr]
