"""The exception types for problems a user can act on, and the exit status each one means.

Every problem a user can fix (a missing file, a bad option, data of the wrong shape) is raised as
:class:`PipelineError`: exit status 2. When the work ran and a measured check said no (an accuracy
gate, served outputs drifting, a missed SLO, failed requests) it is :class:`CheckFailed`: exit
status 1, so a script can tell "called wrong" from "not good enough". The CLI prints either as one
line without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C


class PipelineError(Exception):
    """A problem the user can fix: ``problem`` says what is wrong, ``fix`` what to do."""

    exit_code = EXIT_USER_ERROR

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} — {fix}" if fix else problem)

    def __reduce__(self) -> tuple:
        # rebuilt from (problem, fix) when it crosses a process boundary (pipeline/isolate.py)
        return (type(self), (self.problem, self.fix))


class CheckFailed(PipelineError):
    """The work ran and a measured check failed (accuracy gate, served drift, SLO, failed requests)."""

    exit_code = EXIT_CHECK_FAILED


def require(condition: bool, problem: str, fix: str | None = None) -> None:
    """Raise :class:`PipelineError` unless ``condition`` holds."""
    if not condition:
        raise PipelineError(problem, fix)
