"""What a build shows a person at the end: stages, accuracy gates and artifacts as tables.

The rows are computed once (:mod:`pipeline.reports.build_tables`) and drawn on the terminal here and in
the HTML report (:mod:`pipeline.reports.html`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipeline.core.console import console as make_console
from pipeline.core.objectstore import S3Url
from pipeline.core.tables import to_rich
from pipeline.reports.build_tables import accuracy_data, raw_answers_data, served_data, stage_data, tensorrt_data
from pipeline.reports.variants import variant_notes, variant_rows, variants_data


def stage_table(manifest: dict[str, Any], title: str) -> Table:
    """:func:`stage_data` as a rich table."""
    return to_rich(stage_data(manifest, title))


def accuracy_table(report: dict[str, Any]) -> Table:
    """:func:`accuracy_data` as a rich table."""
    return to_rich(accuracy_data(report))


def served_table(rows: list[dict[str, Any]]) -> Table:
    """:func:`served_data` as a rich table."""
    return to_rich(served_data(rows))


def print_build_summary(
    name: str, manifest_path: Path, repository: Path | S3Url | None, console: Console | None = None, html_reports: Path | None = None
) -> None:
    """Print the stage table, the accuracy table (when variants were gated) and the artifacts of a build;
    refresh the HTML report ``<html_reports>/index.html`` (None: leave it) and print its path."""
    console = console or make_console()
    manifest = json.loads(manifest_path.read_text())
    console.print(stage_table(manifest, f"build '{name}'"))
    checked = tensorrt_data(manifest["results"])
    if checked is not None:
        console.print(to_rich(checked))
    if "accuracy" in manifest["results"]:
        console.print(accuracy_table(manifest["results"]["accuracy"]))
    if "served" in manifest["results"]:
        console.print(served_table(manifest["results"]["served"]["models"]))
    if manifest["results"].get("raw_inputs"):
        for table in raw_answers_data(manifest["results"]["raw_inputs"]):
            console.print(to_rich(table))
    rows = variant_rows(manifest, manifest_path.parent)
    if rows:
        console.print(to_rich(variants_data(rows, manifest["results"].get("latency"), figures=False)))
    for line in variant_notes(rows, manifest["results"]):
        console.print(f"  {escape(line)}")
    for key, path in manifest["artifacts"].items():
        console.print(f"  {key:12} {escape(path)}")
    console.print(f"  manifest     {escape(str(manifest_path))}")
    if repository:
        console.print(f"  repository   {escape(str(repository))}")
    if html_reports is not None:
        from pipeline.reports.html import refresh_html_report

        page = refresh_html_report(manifest_path.parent.parent, html_reports)
        if page:
            console.print(f"  report       {escape(str(page))}")
