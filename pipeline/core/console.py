"""The rich consoles the commands print to: tables on stdout, logs and progress bars on stderr.

When stdout is not a terminal, tables get 160 columns so logs and CI keep them whole. Logs and
progress bars share one stderr console, so log lines print above a live bar instead of through it.
"""

from __future__ import annotations

import functools
import sys

from rich.console import Console


def console() -> Console:
    """A Console on stdout; wide enough for the result tables when stdout is a file or a pipe."""
    return Console() if sys.stdout.isatty() else Console(width=160)


@functools.cache
def err_console() -> Console:
    """The one stderr Console of this process (logging handler and progress bars)."""
    return Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)
