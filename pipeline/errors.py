"""The one exception type for user errors.

Every problem a user can fix (a missing file, a bad option, data of the wrong shape, a failed
accuracy gate) is raised as :class:`PipelineError`. The CLI prints it as one line and exits
non-zero without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class PipelineError(Exception):
    """A problem the user can fix: ``problem`` says what is wrong, ``fix`` what to do."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} — {fix}" if fix else problem)


def require(condition: bool, problem: str, fix: str | None = None) -> None:
    """Raise :class:`PipelineError` unless ``condition`` holds."""
    if not condition:
        raise PipelineError(problem, fix)
