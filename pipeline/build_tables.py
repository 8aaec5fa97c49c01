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
    """Each variant against FP32 ONNX, one row per judged figure of each output: the measured value with
    its confidence bounds, the limit, and the verdict (pipeline.judging)."""
    labels = ", ".join(report.get("labels") or []) or "none"
    table = TableData(f"accuracy vs FP32 ONNX on {report['samples']} samples ({report['data']}; labels: {labels})",
                      ["variant", "output", "kind", "figure", "measured [bounds]", "limit", "gate"], align="lllllrl")  # fmt: skip
    for v in report["variants"]:
        for row in v.get("gates", []):
            table.add([v["variant"], row["output"], row["kind"], row["metric"], figure_text(row),
                       "—" if row["limit"] is None else f"{row['limit']:g}", _row_verdict(row["verdict"])],
                      "bad" if row["verdict"] == "fail" else "")  # fmt: skip
    return table


def figure_text(row: dict[str, Any]) -> str:
    """``value [low, high]`` of one gate row, in points or as a ratio."""
    fmt = (lambda x: f"{x:.2f}") if row["unit"] == "points" else (lambda x: f"{x:.4g}")
    if row["low"] == row["high"] == row["value"]:
        return fmt(row["value"])
    return f"{fmt(row['value'])} [{fmt(row['low'])}, {fmt(row['high'])}]"


def _row_verdict(verdict: str) -> str:
    return {"fail": "FAIL", "reported": "info"}.get(verdict, verdict)


def served_data(rows: list[dict[str, Any]]) -> TableData:
    """Every output of every served model (``verify``): served against in process, and the verdict of the
    model's checks (its gates against served FP32 included); what could not be verified, and why."""
    table = TableData("served through Triton vs in process (metric: accuracy, R² or mIoU with labels; else agreement)",
                      ["model", "ver", "output", "kind", "served", "in-process", "max abs diff", "check"], align="lrllrrrl")  # fmt: skip
    for r in rows:
        if "not_verified" in r:
            table.add([r["model"], "", r["not_verified"], "", "", "", "", "not verified"])
            continue
        for name, out in r["outputs"].items():
            served = out["served_metric"] if out["served_metric"] is not None else out["agreement"]
            table.add([r["model"], str(r["version"]), name, out["kind"], _pct(served), _pct(out["inprocess_metric"]),
                       f"{out['max_abs_diff']:.1e}", _verdict(r["passed"])], "" if r["passed"] else "bad")  # fmt: skip
    return table


def tensorrt_data(results: dict[str, Any]) -> TableData | None:
    """Whether TensorRT takes each GPU variant, as the build checked it where TensorRT could not build: the real
    builder's layers and seconds (TensorRT-RTX), or each problem in one line (node, op, the parser's words); None
    when the build did not check (TensorRT built the plans)."""
    parser = results.get("tensorrt_parser")
    if not isinstance(parser, dict):
        return None
    check = results.get("tensorrt_check") or {}
    built = check.get("variants", {})
    how = f"{check['checker']} for {check['compute_capability']}" if check else "hand-written rules (no TensorRT-RTX)"
    table = TableData("TensorRT build check (plans not kept)", ["variant", "checked with", "result", "layers", "seconds", "problem"],
                      align="lllrrl")
    for variant, problems in parser.items():
        entry = built.get(variant, {})
        layers = str(entry["layers"]) if entry.get("built") else ""
        seconds = f"{entry['seconds']:.2f}" if "seconds" in entry else ""
        result = "refused" if problems else ("built" if entry.get("built") else "parses")
        for i, problem in enumerate(problems or [""]):
            first = i == 0
            table.add([variant if first else "", how if first else "", result if first else "", layers if first else "",
                       seconds if first else "", problem],
                      "bad" if problem else "")  # fmt: skip
    return table
