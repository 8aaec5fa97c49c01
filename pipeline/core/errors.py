"""The exception types for problems a user can act on, and the exit status each one means.

Every problem a user can fix (a missing file, a bad option, data of the wrong shape) is raised as
:class:`PipelineError`: exit status 2. When the work ran and a measured check said no (an accuracy
gate, served outputs drifting, a missed SLO, failed requests) it is :class:`CheckFailed`: exit
status 1, so a script can tell "called wrong" from "not good enough". The CLI prints either as one
line without a traceback; so is a file-system error on a path (:func:`path_error`: a folder that
cannot be created, a file that cannot be written); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

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
        # rebuilt from (problem, fix) when it crosses a process boundary (pipeline/core/isolate.py)
        return (type(self), (self.problem, self.fix))


class CheckFailed(PipelineError):
    """The work ran and a measured check failed (accuracy gate, served drift, SLO, failed requests)."""

    exit_code = EXIT_CHECK_FAILED


def require(condition: bool, problem: str, fix: str | None = None) -> None:
    """Raise :class:`PipelineError` unless ``condition`` holds."""
    if not condition:
        raise PipelineError(problem, fix)


def path_error(exc: OSError) -> PipelineError:
    """``exc``, an error of the file system on ``exc.filename``, as one line naming the path and the reason."""
    # A copy that runs out of space names its source first (shutil's sendfile): the file being written is the second.
    path = Path(exc.filename2 if exc.errno in (errno.ENOSPC, errno.EDQUOT) and exc.filename2 else exc.filename)
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            return PipelineError(f"cannot create {path}: {blocker} is a file, not a folder",
                                 "choose another path, or move that file away")
    fixes = {
        errno.EACCES: "choose a folder you can write to, or fix its permissions",
        errno.EPERM: "choose a folder you can write to, or fix its permissions",
        errno.EROFS: "choose a path on a writable file system",
        errno.ENOSPC: "free space on that disk or choose a path on another one",
        errno.EDQUOT: "free space on that disk or choose a path on another one",
        errno.ENOENT: "check the path",
    }
    reason = (exc.strerror or type(exc).__name__).lower()
    return PipelineError(f"cannot use {path}: {reason}", fixes.get(exc.errno or 0, "check the path and its permissions"))


def require_creatable(path: Path, what: str) -> None:
    """Raise :class:`PipelineError` now, before any work, when ``path`` (a folder to write, ``what``
    names its flag) could not be created or written: a parent is a file, or is not writable."""
    path = Path(path).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise PipelineError(f"cannot create {what} {path}: {existing} is a file, not a folder", "choose another path, or move that file away")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PipelineError(f"cannot create {what} {path}: {existing} is not writable", "choose a folder you can write to, or fix its permissions")
