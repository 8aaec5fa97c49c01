"""Search policies: which candidate to measure next, as a pure function of the scores so far.

``quick`` (the default) is coordinate hill climbing from the published config, like Model
Analyzer's quick mode: measure the current point, then its neighbours one step along each knob
(instances, max batch, preferred sizes, queue delay); move to the best neighbour if it beats the
current point by more than 2%, and stop at a point none of its neighbours beats. ``grid``
measures the published config, then every point of the space in order.

Both are deterministic given the scores: a resumed tune replays the same proposals, finds the
measured ones in the trial cache, and continues exactly where it was killed. The budget
(``--max-trials``, ``--max-minutes``) is enforced by the caller between proposals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

from pipeline.core.errors import PipelineError
from pipeline.tune.space import Candidate, SearchSpace

SEARCHES = ("quick", "grid")
MIN_GAIN = 0.02


class SearchPolicy(Protocol):
    """Proposes the next candidate given the scores of those measured (None: the search is done)."""

    def propose(self, scores: Mapping[Candidate, float]) -> Candidate | None: ...


class QuickSearch:
    """Coordinate hill climbing over the space's axes, starting at ``start``."""

    def __init__(self, space: SearchSpace, start: Candidate) -> None:
        self.space = space
        self.start = space.index_of(start)
        self.start_candidate = start

    def _candidate(self, index: tuple[int, ...]) -> Candidate:
        return self.start_candidate if index == self.start else self.space.candidate(index)

    def neighbours(self, index: tuple[int, ...]) -> list[tuple[int, ...]]:
        """One step up and one step down along each knob, in knob order."""
        out = []
        for axis, values in enumerate(self.space.axes):
            for step in (1, -1):
                moved = index[axis] + step
                if 0 <= moved < len(values):
                    out.append(index[:axis] + (moved,) + index[axis + 1 :])
        return out

    def propose(self, scores: Mapping[Candidate, float]) -> Candidate | None:
        """The next candidate to measure, or None when the search is done."""
        current = self.start
        visited = {current}
        while True:
            here = self._candidate(current)
            if here not in scores:
                return here
            around = [n for n in self.neighbours(current) if self._candidate(n) != here]
            for n in around:
                if self._candidate(n) not in scores:
                    return self._candidate(n)
            if not around:
                return None
            best = max(around, key=lambda n: scores[self._candidate(n)])
            if not _better(scores[self._candidate(best)], scores[here]) or best in visited:
                return None
            visited.add(best)
            current = best


class GridSearch:
    """The published config first, then every distinct point of the space."""

    def __init__(self, space: SearchSpace, start: Candidate) -> None:
        order = [start] + [space.candidate(i) for i in space.all_indices()]
        self.order = list(dict.fromkeys(order))

    def propose(self, scores: Mapping[Candidate, float]) -> Candidate | None:
        """The next candidate to measure, or None when the search is done."""
        return next((c for c in self.order if c not in scores), None)


def _better(new: float, old: float) -> bool:
    if math.isinf(old):
        return new > old
    return new > old + MIN_GAIN * abs(old)


def search_policy(name: str, space: SearchSpace, start: Candidate) -> SearchPolicy:
    """The policy called ``name`` (``quick`` or ``grid``) over ``space`` from the published ``start``."""
    if name == "quick":
        return QuickSearch(space, start)
    if name == "grid":
        return GridSearch(space, start)
    raise PipelineError(f"unknown --search '{name}'", f"use one of: {', '.join(SEARCHES)}")
