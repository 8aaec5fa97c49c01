"""The rows of a build's result tables (stages, accuracy gates, served verification), computed once:
drawn on the terminal by :mod:`pipeline.report` and into the page by :mod:`pipeline.htmlreport`."""

from __future__ import annotations

from typing import Any

from pipeline.tables import TableData


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
