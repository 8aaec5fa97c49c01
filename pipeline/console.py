"""The rich console the commands print tables to (160 columns when not a terminal, so logs and CI keep whole tables)."""

from __future__ import annotations

import sys

from rich.console import Console


def console() -> Console:
    """A Console on stdout; wide enough for the result tables when stdout is a file or a pipe."""
    return Console() if sys.stdout.isatty() else Console(width=160)
