"""What a build shows a person at the end: stages, accuracy gates and artifacts as tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipeline.console import console as make_console


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2%}"


def stage_table(manifest: dict[str, Any], title: str) -> Table:
    """Stages with status (ran / skipped / not run) and seconds."""
    table = Table(title=title)
    for column in ("stage", "status", "seconds", "note"):
        table.add_column(column)
    for stage in manifest["stages"]:
        table.add_row(stage["name"], stage["status"], f"{stage['seconds']:.2f}", escape(stage.get("note", "")))
    return table


def accuracy_table(report: dict[str, Any]) -> Table:
    """Each variant against FP32 ONNX: accuracy, the drop with its confidence bounds, agreement, errors, verdict."""
    table = Table(title=f"accuracy vs FP32 ONNX on {report['samples']} samples ({escape(report['data'])})")
    for column in ("variant", "acc", "FP32 acc", "drop (bounds) / max", "top-1 agree", "max abs", "min cos", "gate"):
        table.add_column(column, justify="right" if column != "variant" else "left")
    for v in report["variants"]:
        d = v.get("drop")
        label = "" if not d or d.get("paired", True) else "disagree "
        drop = "—" if not d else f"{label}{d['drop_points']:.2f} [{d['low_points']:.2f}, {d['high_points']:.2f}] / {v['gate']['max_drop_points']:g}"
        outputs = v["outputs"].values()
        worst = max(outputs, key=lambda o: o["max_abs"])
        table.add_row(
            v["variant"],
            _pct(v["accuracy"]),
            _pct(v["reference_accuracy"]),
            drop,
            _pct(v["top1_agreement"]),
            f"{worst['max_abs']:.1e}",
            f"{min(o.get('min_cosine', 1.0) for o in outputs):.4f}",
            "[green]pass[/]" if v["passed"] else "[red]FAIL[/]",
        )
    return table


def served_table(rows: list[dict[str, Any]]) -> Table:
    """Served vs in-process accuracy per model (``verify``)."""
    table = Table(title="accuracy through Triton vs in process")
    for column in ("model", "ver", "samples", "served", "in-process", "top-1 agree", "max abs diff", "check"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in rows:
        table.add_row(
            r["model"], str(r["version"]), str(r["samples"]), _pct(r["served_accuracy"]), _pct(r["inprocess_accuracy"]),
            _pct(r["top1_agreement"]), f"{r['max_abs_diff']:.1e}", "[green]pass[/]" if r["passed"] else "[red]FAIL[/]",
        )
    return table


def print_build_summary(name: str, manifest_path: Path, repository: Path | None, console: Console | None = None) -> None:
    """Print the stage table, the accuracy table (when variants were gated) and the artifacts of a build."""
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
