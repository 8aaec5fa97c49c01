"""What a build shows a person at the end: stages, accuracy gates and artifacts as tables.

The rows are computed once (:class:`pipeline.tables.TableData`) and drawn on the terminal here
and in the HTML report (:mod:`pipeline.htmlreport`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipeline.console import console as make_console
from pipeline.tables import TableData, to_rich


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2%}"


def _verdict(passed: bool, undecided: bool = False) -> str:
    return "pass" if passed else ("undecided" if undecided else "FAIL")


def stage_data(manifest: dict[str, Any], title: str) -> TableData:
    """Stages with status (ran / skipped / not run / failed) and seconds."""
    table = TableData(title, ["stage", "status", "seconds", "note"], align="llrl")
    for stage in manifest["stages"]:
        table.add([stage["name"], stage["status"], f"{stage['seconds']:.2f}", stage.get("note", "")],
                  "bad" if stage["status"] == "failed" else "")  # fmt: skip
    return table


def accuracy_data(report: dict[str, Any]) -> TableData:
    """Each variant against FP32 ONNX: accuracy, the drop with its confidence bounds, agreement, errors, verdict."""
    table = TableData(f"accuracy vs FP32 ONNX on {report['samples']} samples ({report['data']})",
                      ["variant", "acc", "FP32 acc", "drop (bounds) / max", "top-1 agree", "max abs", "min cos", "gate"])  # fmt: skip
    for v in report["variants"]:
        d = v.get("drop")
        label = "" if not d or d.get("paired", True) else "disagree "
        drop = "—" if not d else f"{label}{d['drop_points']:.2f} [{d['low_points']:.2f}, {d['high_points']:.2f}] / {v['gate']['max_drop_points']:g}"
        outputs = v["outputs"].values()
        worst = max(outputs, key=lambda o: o["max_abs"])
        table.add([
            v["variant"], _pct(v["accuracy"]), _pct(v["reference_accuracy"]), drop, _pct(v["top1_agreement"]),
            f"{worst['max_abs']:.1e}", f"{min(o.get('min_cosine', 1.0) for o in outputs):.4f}",
            _verdict(v["passed"], bool(v.get("undecided"))),
        ])  # fmt: skip
    return table


def served_data(rows: list[dict[str, Any]]) -> TableData:
    """Served vs in-process accuracy per model (``verify``)."""
    table = TableData("accuracy through Triton vs in process",
                      ["model", "ver", "samples", "served", "in-process", "top-1 agree", "max abs diff", "check"])  # fmt: skip
    for r in rows:
        table.add([
            r["model"], str(r["version"]), str(r["samples"]), _pct(r["served_accuracy"]), _pct(r["inprocess_accuracy"]),
            _pct(r["top1_agreement"]), f"{r['max_abs_diff']:.1e}", _verdict(r["passed"]),
        ])  # fmt: skip
    return table


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
    name: str, manifest_path: Path, repository: Path | None, console: Console | None = None, html_reports: Path | None = Path("reports")
) -> None:
    """Print the stage table, the accuracy table (when variants were gated) and the artifacts of a build;
    refresh the HTML report ``<html_reports>/index.html`` (None: leave it) and print its path."""
    console = console or make_console()
    manifest = json.loads(manifest_path.read_text())
    console.print(stage_table(manifest, f"build '{name}'"))
    if "accuracy" in manifest["results"]:
        console.print(accuracy_table(manifest["results"]["accuracy"]))
    if "served" in manifest["results"]:
        console.print(served_table(manifest["results"]["served"]["models"]))
    for key, path in manifest["artifacts"].items():
        console.print(f"  {key:12} {escape(path)}")
    console.print(f"  manifest     {escape(str(manifest_path))}")
    if repository:
        console.print(f"  repository   {escape(str(repository))}")
    if html_reports is not None:
        from pipeline.htmlreport import refresh_html_report

        page = refresh_html_report(manifest_path.parent.parent, html_reports)
        if page:
            console.print(f"  report       {escape(str(page))}")
