"""Run one function in a fresh child process, so whatever it imports and allocates leaves with it.

The SavedModel export imports TensorFlow and builds the Keras model: about 1 GB that the build
process would otherwise keep while the tf2onnx child converts, and the two together would exceed
the memory budget. :func:`call_in_child` runs such a function in a spawned interpreter (no fork of a
process that holds TensorFlow threads) and hands back its return value; a
:class:`~pipeline.errors.PipelineError` raised there is raised here unchanged (one line for the
user), any other exception as a ``RuntimeError`` carrying the child's traceback.
"""

from __future__ import annotations

import logging
import multiprocessing
import traceback
from typing import Any, Callable, TypeVar

from pipeline.errors import PipelineError

T = TypeVar("T")

log = logging.getLogger(__name__)


def _child(conn: Any, level: int, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    logging.basicConfig(level=level, format="%(message)s")
    try:
        conn.send(("ok", fn(*args, **kwargs)))
    except PipelineError as exc:
        conn.send(("user", exc))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        pass
    except BaseException:  # noqa: BLE001 - a bug: its traceback goes to the parent
        conn.send(("bug", traceback.format_exc()))
    finally:
        conn.close()


def call_in_child(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a spawned child process; arguments and result must pickle."""
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, logging.getLogger().getEffectiveLevel(), fn, args, kwargs), daemon=True)
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
