"""Run one function in a fresh child process, so whatever it imports and allocates leaves with it.

The SavedModel export imports TensorFlow and builds the Keras model: about 1 GB that the build
process would otherwise keep while the tf2onnx child converts, and the two together would exceed
the memory budget. :func:`call_in_child` runs such a function in a spawned interpreter (no fork of a
process that holds TensorFlow threads) and hands back its return value; a
:class:`~pipeline.core.errors.PipelineError` raised there is raised here unchanged (one line for the
user), any other exception as a ``RuntimeError`` carrying the child's traceback.

A child must not outlive the build: a build killed with SIGTERM or SIGKILL runs no cleanup, and its
converting child would go on for minutes, orphaned. :func:`die_with_parent` asks the kernel to kill
the child when its parent goes (both the spawned children here and the tf2onnx subprocess use it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import signal
import traceback
from typing import Any, Callable, TypeVar

from pipeline.core.errors import PipelineError, path_error
from pipeline.core.logs import native_stderr_filtered, quiet_libraries

T = TypeVar("T")

log = logging.getLogger(__name__)


_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when the thread that started it exits
    (Linux ``PR_SET_PDEATHSIG``); call it first thing in a child, or as a ``preexec_fn``."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig)


def _child(conn: Any, parent: int, level: int, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the line above: nobody waits for the result
        os._exit(1)
    logging.basicConfig(level=level, format="%(message)s")
    verbose = level <= logging.DEBUG
    quiet_libraries(verbose)
    try:
        with contextlib.nullcontext() if verbose else native_stderr_filtered():
            result = fn(*args, **kwargs)
        conn.send(("ok", result))
    except PipelineError as exc:
        conn.send(("user", exc))
    except OSError as exc:
        # A full disk or a folder it may not write is the user's to fix, as the CLI reports it in one process.
        conn.send(("user", path_error(exc)) if exc.filename is not None else ("bug", traceback.format_exc()))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        pass
    except BaseException:  # noqa: BLE001 - a bug: its traceback goes to the parent
        conn.send(("bug", traceback.format_exc()))
    finally:
        conn.close()


def call_in_child(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a spawned child process; arguments and result must pickle. Called in such a child
    (a stage the build already runs in one), it runs ``fn`` there: a child of its own would add nothing."""
    if multiprocessing.current_process().daemon:
        return fn(*args, **kwargs)
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, os.getpid(), logging.getLogger().getEffectiveLevel(), fn, args, kwargs), daemon=True)
    proc.start()
    send.close()
    try:
        try:
            kind, value = receive.recv()
        except EOFError:
            proc.join()
            raise RuntimeError(f"{fn.__module__}.{fn.__qualname__} died in its child process (exit status {proc.exitcode})") from None
        proc.join()
    finally:
        receive.close()
        if proc.is_alive():  # interrupted while waiting: do not leave the child running
            proc.terminate()
            proc.join()
    if kind == "user":
        raise value
    if kind == "bug":
        raise RuntimeError(f"{fn.__module__}.{fn.__qualname__} failed in its child process:\n{value}")
    return value
