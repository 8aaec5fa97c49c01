"""Progress of long steps: a rich progress bar on a terminal, one summary line otherwise.

A stage wraps its loop in :func:`progress` and calls ``advance()`` per step (or iterates through
``track()``). On a terminal the bar is drawn on the shared stderr console, below the log lines;
steps nested in another (the server start inside a served check) get their own row of the same
display. When stderr is not a terminal (a pipe, a CI log) nothing is drawn while it runs and one
line is logged when the step ends, so logs keep one line per step instead of one per batch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from pipeline.core.console import err_console

log = logging.getLogger(__name__)

T = TypeVar("T")

_lock = threading.Lock()
_live: Any = None  # the rich Progress shared by nested steps while any is running
_depth = 0


class Step:
    """One running step: ``advance()`` as work gets done; ``note()`` shows what it is on now."""

    def __init__(self, description: str, total: int | None, unit: str, bar: Any, task: Any) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.done = 0
        self.started = time.perf_counter()
        self._bar = bar
        self._task = task
        self._note = ""

    def advance(self, steps: int = 1) -> None:
        """Count ``steps`` more units of work as done."""
        self.done += steps
        if self._bar is not None:
            self._bar.update(self._task, advance=steps)

    def note(self, text: str) -> None:
        """Show ``text`` beside the description (e.g. the load point being measured)."""
        self._note = text
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.description} {text}".rstrip())

    def track(self, items: Iterable[T]) -> Iterator[T]:
        """Yield ``items``, counting one step per item."""
        for item in items:
            yield item
            self.advance()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def summary(self) -> str:
        """``"<description>: 16/16 batches in 0.4 s"`` (without a total: ``"… 16 batches …"``)."""
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        amount = f"{count} {self.unit} " if self.unit else ""
        return f"{self.description}: {amount}in {self.seconds:.1f} s"


def interactive() -> bool:
    """Whether progress bars are drawn (stderr is a terminal that is not 'dumb')."""
    console = err_console()
    return console.is_terminal and not console.is_dumb_terminal


@contextlib.contextmanager
def progress(description: str, total: int | None = None, *, unit: str = "", summary: bool = True) -> Iterator[Step]:
    """Show the progress of one long step; see the module docstring.

    ``total`` None draws a spinner instead of a bar. ``summary`` False logs no closing line off a
    terminal, for steps that log their own result line anyway.
    """
    global _live, _depth
    bar = task = None
    if interactive():
        with _lock:
            if _live is None:
                _live = _new_display()
                _live.start()
            _depth += 1
            bar = _live
            task = bar.add_task(description, total=total, counted=total is not None)
    step = Step(description, total, unit, bar, task)
    try:
        yield step
    finally:
        if bar is not None:
            with _lock:
                bar.update(task, description=description, total=step.done if total is None else total, completed=step.done if total is None else None)
                bar.stop_task(task)
                _depth -= 1
                if _depth == 0:
                    bar.stop()
                    _live = None
    if summary and bar is None:
        log.info("%s", step.summary())


def _new_display() -> Any:
    from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.text import Text

    class Count(ProgressColumn):
        """``done/total`` for counted steps, nothing for open-ended ones (a spinner alone)."""

        def render(self, task: Any) -> Text:
            return Text(f"{task.completed:.0f}/{task.total:.0f}" if task.fields.get("counted") else "", style="progress.download")

    return Progress(
        SpinnerColumn(finished_text="✓"),
        TextColumn("{task.description}"),
        BarColumn(),
        Count(),
        TimeElapsedColumn(),
        console=err_console(),
        transient=False,
    )
