"""Search policies: deterministic proposals from scores, hill climbing reaches the optimum, grid covers the space."""

from __future__ import annotations

import math

import pytest

from pipeline.core.errors import PipelineError
from pipeline.tune.policy import GridSearch, QuickSearch, search_policy
from pipeline.tune.space import Candidate, search_space

PUBLISHED = Candidate(1, 64, (32, 64), 100)


def run(policy, score) -> list[Candidate]:  # type: ignore[no-untyped-def]
    scores: dict[Candidate, float] = {}
    order = []
    while (c := policy.propose(scores)) is not None:
        assert c not in scores
        scores[c] = score(c)
        order.append(c)
    return order


def throughput(c: Candidate) -> float:
    """A made-up landscape: best at 2 instances, max batch 16, no queue delay."""
    return 1000 - 100 * abs(c.instance_count - 2) - 50 * abs(math.log2(c.max_batch_size) - 4) - c.max_queue_delay_us / 2


def test_quick_starts_at_the_published_config_and_climbs_to_the_optimum() -> None:
    space = search_space(PUBLISHED, None)
    order = run(QuickSearch(space, PUBLISHED), throughput)
    assert order[0] == PUBLISHED
    best = max(order, key=throughput)
    assert (best.instance_count, best.max_batch_size, best.max_queue_delay_us) == (2, 16, 0)
    assert len(order) < space.size  # it did not walk the whole grid


def test_quick_replays_identically_from_a_prefix_of_scores() -> None:
    space = search_space(PUBLISHED, None)
    full = run(QuickSearch(space, PUBLISHED), throughput)
    resumed = QuickSearch(space, PUBLISHED)
    known = {c: throughput(c) for c in full[:3]}
    assert resumed.propose(known) == full[3]


def test_quick_moves_out_of_a_start_that_meets_no_slo() -> None:
    space = search_space(PUBLISHED, None)
    # Negative scores (−p99) for candidates missing the SLO: a positive neighbour must win.
    order = run(QuickSearch(space, PUBLISHED), lambda c: -20.0 if c.max_queue_delay_us else 500.0)
    assert order[0] == PUBLISHED
    assert any(c.max_queue_delay_us == 0 for c in order)


def test_quick_stops_when_every_score_is_minus_infinity() -> None:
    space = search_space(PUBLISHED, None, instances="1", max_batch="64", preferred="half+max", queue_delay_us="100")
    assert run(QuickSearch(space, PUBLISHED), lambda c: -math.inf) == [PUBLISHED]


def test_grid_measures_the_published_config_first_then_every_point_once() -> None:
    space = search_space(PUBLISHED, None, instances="1,2", max_batch="32", queue_delay_us="0")
    order = run(GridSearch(space, PUBLISHED), throughput)
    assert order[0] == PUBLISHED
    assert len(order) == len(set(order)) == space.size


def test_unknown_search_is_one_error() -> None:
    with pytest.raises(PipelineError, match="unknown --search 'random'"):
        search_policy("random", search_space(PUBLISHED, None), PUBLISHED)
