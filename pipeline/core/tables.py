"""Result tables as plain data, drawn on the terminal with rich and in the HTML report.

Every result table (build stages, accuracy gates, served verification, load-test points and
metrics) is computed once as a :class:`TableData` of strings; :func:`to_rich` draws it on the
terminal and :mod:`pipeline.reports.html` writes the same rows into the page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERDICT_STYLES = {"pass": "green", "FAIL": "red", "undecided": "yellow"}


@dataclass
class TableData:
    """A titled table of strings; ``styles`` per row (``"best"``, ``"bad"``, ``"dim"`` or ``""``)."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    styles: list[str] = field(default_factory=list)
    left: int = 1  # how many leading columns are text (left-aligned); the rest are numbers
    caption: str = ""
    align: str = ""  # one "l" or "r" per column, when ``left`` does not say it

    def right_aligned(self, column: int) -> bool:
        """Whether ``column`` holds numbers (right-aligned)."""
        return self.align[column] == "r" if self.align else column >= self.left

    def add(self, cells: list[str], style: str = "") -> None:
        """Append a row."""
        self.rows.append(cells)
        self.styles.append(style)


_RICH_ROW = {"best": "bold green", "bad": "red", "dim": "dim", "": None}


def to_rich(table: TableData) -> Any:
    """A ``rich.table.Table`` of ``table``; verdict cells (pass / FAIL / undecided) coloured; at any
    width no cell is cut: the first column stays whole, the others wrap."""
    from rich.markup import escape
    from rich.table import Table

    out = Table(title=escape(table.title), caption=escape(table.caption) if table.caption else None)
    for i, name in enumerate(table.columns):
        # On a narrow terminal cells wrap (a word too long for its column folds) instead of being cut
        # to "fp16-on…"; the first column names the row (variant, model, point) and stays whole.
        first = i == 0
        widest = max((len(row[0]) for row in table.rows), default=0) if first else 0
        out.add_column(escape(name), justify="right" if table.right_aligned(i) else "left", overflow="fold",
                       no_wrap=first, min_width=widest or None)
    for cells, style in zip(table.rows, table.styles):
        out.add_row(*(f"[{VERDICT_STYLES[c]}]{c}[/]" if c in VERDICT_STYLES else escape(c) for c in cells), style=_RICH_ROW[style])
    return out
