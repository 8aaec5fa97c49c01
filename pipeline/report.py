"""What a build shows a person at the end: stages, timings and artifacts as a table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from pipeline.build import BuildResult


def print_build_summary(result: "BuildResult", console: Console | None = None) -> None:
    """Print the stage table (ran / skipped / not run, seconds) and where the artifacts are."""
    import json

    console = console or Console(stderr=False)
    manifest = json.loads(result.manifest.read_text())
    table = Table(title=f"build '{result.name}'")
    for column in ("stage", "status", "seconds", "note"):
        table.add_column(column)
    for stage in manifest["stages"]:
        table.add_row(stage["name"], stage["status"], f"{stage['seconds']:.2f}", stage.get("note", ""))
    console.print(table)
    for key, path in manifest["artifacts"].items():
        console.print(f"  {key:12} {path}")
    console.print(f"  manifest     {result.manifest}")
    if result.repository:
        console.print(f"  repository   {result.repository}")
