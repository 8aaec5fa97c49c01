"""The rows of a build's result tables (stages, accuracy gates, served verification), computed once:
drawn on the terminal by :mod:`pipeline.reports.terminal` and into the page by :mod:`pipeline.reports.html`."""

from __future__ import annotations

from typing import Any

from pipeline.core.tables import TableData


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2%}"


def _verdict(passed: bool, undecided: bool = False) -> str:
    return "pass" if passed else ("undecided" if undecided else "FAIL")


def stage_data(manifest: dict[str, Any], title: str) -> TableData:
    """Stages with status and seconds. A skipped stage shows the time of the run that produced its outputs,
    with that run's date; a stage that did not run shows no seconds."""
    table = TableData(title, ["stage", "status", "seconds", "note"], align="llrl")
    for stage in manifest["stages"]:
        table.add([stage["name"], stage_status(stage), stage_seconds(stage), stage.get("note", "")],
                  "bad" if stage["status"] == "failed" else "")  # fmt: skip
    return table


def stage_status(stage: dict[str, Any]) -> str:
    """``ran``, ``skipped (ran 2026-12-03 20:41)``, ``not run`` or ``failed``."""
    when = short_time(stage.get("ran_at") or "")
    return f"skipped (ran {when})" if stage["status"] == "skipped" and when else stage["status"]


def stage_seconds(stage: dict[str, Any]) -> str:
    """The seconds of the run that produced the stage's outputs ("" for a stage that did not run)."""
    if stage["status"] == "not run":
        return ""
    seconds = _made_seconds(stage)
    return "—" if seconds is None else f"{seconds:.2f}"


def _made_seconds(stage: dict[str, Any]) -> float | None:
    if stage["status"] == "not run":
        return None
    if stage.get("ran_seconds") is not None:
        return float(stage["ran_seconds"])
    return None if stage["status"] == "skipped" else stage.get("seconds")  # a skip's own time is not the stage's


def stage_total(manifest: dict[str, Any]) -> str:
    """The stages' seconds as the artifacts took them; a build that skipped stages adds its own time."""
    stages = manifest["stages"]
    made = sum(_made_seconds(s) or 0.0 for s in stages)
    if not any(s["status"] == "skipped" for s in stages):
        return f"{made:.1f} s of stages"
    this = sum(s.get("seconds") or 0.0 for s in stages if s["status"] != "skipped")
    checks = sum(s.get("seconds") or 0.0 for s in stages if s["status"] == "skipped")
    return f"{made:.1f} s of stages when the artifacts were made · this build: {this + checks:.1f} s"


def short_time(iso: str) -> str:
    """``2026-12-03T20:41:05+00:00`` → ``2026-12-03 20:41``; other text as it is."""
    return iso[:16].replace("T", " ") if len(iso) >= 16 and iso[10:11] == "T" else iso


def accuracy_data(report: dict[str, Any]) -> TableData:
    """Each variant against FP32 ONNX, one row per judged figure of each output: the measured value with
    its confidence bounds and unit, the limit, and the verdict (pipeline.accuracy.judging)."""
    labels = ", ".join(report.get("labels") or []) or "none"
    table = TableData(f"accuracy vs FP32 ONNX on {report['samples']} samples ({report['data']}; labels: {labels})",
                      ["variant", "output", "kind", "figure", "measured [bounds]", "limit", "gate"], align="lllllrl")  # fmt: skip
    units = set()
    for v in report["variants"]:
        for row in v.get("gates", []):
            units.add(row.get("unit") or "")
            table.add([v["variant"], row["output"], row["kind"] or "", row["metric"], figure_text(row), limit_text(row),
                       _row_verdict(row["verdict"])], "bad" if row["verdict"] == "fail" else "")  # fmt: skip
    confidence = next((v["gate"]["confidence"] for v in report["variants"] if isinstance(v.get("gate"), dict) and "confidence" in v["gate"]), None)
    bounds = f"[low, high]: the figure's {confidence:.0%} confidence bounds" if isinstance(confidence, (int, float)) else "[low, high]: its confidence bounds"
    table.caption = ("pt: percentage points; " if "points" in units else "") + bounds + "; a gate passes when the worse bound is within the limit"
    return table


def unit_suffix(row: dict[str, Any]) -> str:
    """`` pt`` for a figure in percentage points, else nothing (a ratio, a cosine, an absolute error)."""
    return " pt" if row.get("unit") == "points" else ""


def figure_text(row: dict[str, Any]) -> str:
    """``value [low, high] pt`` of one gate row (points: percentage points; else a ratio or an error)."""
    if row["value"] is None:
        return "—"
    fmt = (lambda x: f"{x:.2f}") if row["unit"] == "points" else (lambda x: f"{x:.4g}")
    if row["low"] == row["high"] == row["value"]:
        return fmt(row["value"]) + unit_suffix(row)
    return f"{fmt(row['value'])} [{fmt(row['low'])}, {fmt(row['high'])}]{unit_suffix(row)}"


def limit_text(row: dict[str, Any]) -> str:
    """The gate's limit with the figure's unit (``≤ 1 pt``, ``≤ 0.01``, ``≥ 0.995``)."""
    if row["limit"] is None:
        return "—"
    return f"{'≥' if row.get('worse') == 'lower' else '≤'} {row['limit']:g}{unit_suffix(row)}"


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
        for gate in r.get("gates", []):  # verify --accuracy-target: MLPerf's rule, a row of its own
            if gate["metric"].startswith("MLPerf target"):
                table.add([r["model"], str(r["version"]), gate["output"], gate["metric"], _pct(gate["value"]), f"≥ {_pct(gate['limit'])}", "",
                           _row_verdict(gate["verdict"])], "" if gate["verdict"] == "pass" else "bad")  # fmt: skip
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


def raw_answers_data(report: dict[str, Any]) -> list[TableData]:
    """One raw-input ensemble's answers (``verify --data``): the gate's figures, then the class names of the first files."""
    variant = f"; served variant {report['variant']}" if report.get("variant") else ""
    gate = TableData(f"raw inputs through the ensemble {report['model']} ({report['files']} from {report['folder']}{variant})",
                     ["output", "kind", "figure", "value [95% bounds]", "limit", "verdict"], align="lllrrl")
    for row in report["rows"]:
        gate.add([row["output"], row["kind"] or "—", row["metric"], figure_text(row), limit_text(row), _row_verdict(row["verdict"])],
                 "bad" if row["verdict"] == "fail" else "")
    for name, summary in report["summary"].items():
        if summary.get("accuracy") is not None:
            gate.add([name, "classes", "accuracy from raw inputs (the reference's)", f"{_pct(summary['accuracy'])} "
                      f"({_pct(summary.get('reference_accuracy'))})", "", "info"])
    if report.get("accuracy_vs_tensor_path"):
        drop = report["accuracy_vs_tensor_path"]
        gate.add(["", "", "accuracy drop vs the tensor path", f"{drop['drop_points']:.2f} [{drop['low']:.2f}, {drop['high']:.2f}] pt",
                  f"≤ {drop['limit']:g} pt", "FAIL" if drop["low"] > drop["limit"] else ("undecided" if drop["high"] > drop["limit"] else "pass")])
    gate.caption = report.get("preprocess", "")
    answers = TableData("answers (Triton's classification extension: score:index:label)", ["input", "top 1", "top 2", "top 3"], left=4)
    for name, top in (report.get("answers") or {}).items():
        answers.add([name, *top[:3]])
    return [gate, answers] if answers.rows else [gate]
