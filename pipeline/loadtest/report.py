"""Load-test reports: a rich table for the screen, ``results.json``, ``results.csv`` and plots."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from pipeline.loadtest.results import EndpointResult, PointResult, RunResult, best_point

CSV_FIELDS = (
    "model", "endpoint", "protocol", "encoding", "policy", "load", "arrivals", "batch_size", "stable", "overloaded", "aborted",
    "requests", "seconds", "throughput_rps", "infer_per_s",
    "latency_mean_ms", "latency_p50_ms", "latency_p90_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms",
    "send_lag_p50_ms", "send_lag_p99_ms", "unsent", "abandoned", "error_count", "errors",
    "server_request_us", "server_queue_us", "server_compute_input_us", "server_compute_infer_us",
    "server_compute_output_us", "server_avg_batch_size", "client_successes_total", "server_successes_total",
    "client_cpu_us_per_request",
    "metrics_inferences", "metrics_executions", "metrics_failure", "metrics_request_us", "metrics_queue_us",
    "metrics_compute_infer_us", "metrics_cpu_utilization", "metrics_gpu_utilization", "metrics_gpu_memory_used_bytes", "metrics_note",
)  # fmt: skip


def table(result: RunResult, slo_p99_ms: float | None = None) -> Any:
    """A ``rich.table.Table`` of every point (aggregate rows, then one row per endpoint if several)."""
    from rich.table import Table

    several = len(result.settings.get("endpoints", [])) > 1
    t = Table(title=f"Triton load test — {result.settings['protocol']} ({result.points[0].encoding if result.points else ''})")
    for name, justify in [
        ("model", "left"), ("load", "right"), ("infer/s", "right"), ("p50 ms", "right"), ("p90", "right"),
        ("p95", "right"), ("p99", "right"), ("max", "right"), ("errors", "right"), ("queue µs", "right"),
        ("in µs", "right"), ("infer µs", "right"), ("out µs", "right"), ("batch", "right"),
        ("client µs/req", "right"), ("stable", "center"),
    ]:  # fmt: skip
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    best = best_point(result.points, slo_p99_ms) if slo_p99_ms is not None else None
    for point in result.points:
        style = "bold green" if point is best else ("red" if point.aborted or point.aggregate.error_count else None)
        t.add_row(*_cells(point, point.aggregate, point.model), style=style)
        if several:
            for e in point.endpoints:
                t.add_row(*_cells(point, e, f"  └ {e.endpoint}"), style="dim")
    return t


def _cells(point: PointResult, r: EndpointResult, name: str) -> list[str]:
    s = r.server or {}
    lat = r.latency
    return [
        name, point.label, _num(r.infer_per_s, 1), _num(lat.p50_ms, 3), _num(lat.p90_ms, 3), _num(lat.p95_ms, 3),
        _num(lat.p99_ms, 3), _num(lat.max_ms, 3), str(r.error_count), _num(s.get("queue_us"), 0),
        _num(s.get("compute_input_us"), 0), _num(s.get("compute_infer_us"), 0), _num(s.get("compute_output_us"), 0),
        _num(s.get("avg_batch_size"), 2), _num(point.client_cpu_us_per_request, 1),
        "aborted" if point.aborted else "overloaded" if point.overloaded else ("yes" if point.stable else "no"),
    ]  # fmt: skip


def _num(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:,.{digits}f}"


def metrics_rows(result: RunResult) -> tuple[list[str], list[list[str]], list[str]]:
    """Triton's Prometheus metrics per point: column names, rows (aggregate per point), and the notes
    (why metrics or GPU figures are missing) — for the screen and the HTML report."""
    columns = ["model", "load", "inferences", "executions", "batch", "failures", "request µs", "queue µs", "infer µs", "CPU util", "GPU util", "GPU memory"]
    rows, notes = [], []
    for point in result.points:
        m = point.aggregate.metrics
        if m is None:
            notes.append(point.aggregate.metrics_note)
            rows.append([point.model, point.label] + ["—"] * (len(columns) - 2))
            continue
        gpus = m.get("gpus") or []
        if not gpus:
            notes.append(str(m.get("gpu_note", "")))
        util = [g["utilization"] for g in gpus if g.get("utilization") is not None]
        used = sum(g["memory_used_bytes"] or 0 for g in gpus)
        total = sum(g["memory_total_bytes"] or 0 for g in gpus)
        rows.append([
            point.model, point.label, _num(m["inferences"], 0), _num(m["executions"], 0), _num(m["avg_batch_size"], 2),
            _num(m["failure"], 0), _num(m["request_us"], 0), _num(m["queue_us"], 0), _num(m["compute_infer_us"], 0),
            "—" if m.get("cpu_utilization") is None else f"{m['cpu_utilization']:.0%}",
            f"{sum(util) / len(util):.0%}" if util else "—",
            f"{used / 2**30:.1f}/{total / 2**30:.1f} GiB" if total else "—",
        ])  # fmt: skip
    return columns, rows, list(dict.fromkeys(n for n in notes if n))


def metrics_table(result: RunResult) -> Any:
    """A ``rich.table.Table`` of :func:`metrics_rows`, the notes as its caption."""
    from rich.markup import escape
    from rich.table import Table

    columns, rows, notes = metrics_rows(result)
    t = Table(title="Triton Prometheus metrics over each point (/metrics deltas, gauges at the end)",
              caption=escape("; ".join(notes)) if notes else None)  # fmt: skip
    for name in columns:
        t.add_column(name, justify="left" if name == "model" else "right")
    for row in rows:
        t.add_row(*row)
    return t


def _metrics_cells(r: EndpointResult) -> dict[str, Any]:
    m = r.metrics or {}
    gpus = m.get("gpus") or []
    util = [g["utilization"] for g in gpus if g.get("utilization") is not None]
    return {
        "metrics_inferences": m.get("inferences", ""), "metrics_executions": m.get("executions", ""),
        "metrics_failure": m.get("failure", ""), "metrics_request_us": _blank(m.get("request_us")),
        "metrics_queue_us": _blank(m.get("queue_us")), "metrics_compute_infer_us": _blank(m.get("compute_infer_us")),
        "metrics_cpu_utilization": _blank(m.get("cpu_utilization")),
        "metrics_gpu_utilization": sum(util) / len(util) if util else "",
        "metrics_gpu_memory_used_bytes": sum(g.get("memory_used_bytes") or 0 for g in gpus) if gpus else "",
        "metrics_note": r.metrics_note or m.get("gpu_note", ""),
    }  # fmt: skip


def _blank(value: Any) -> Any:
    return "" if value is None else value


def csv_rows(result: RunResult) -> list[dict[str, Any]]:
    """One row per point and endpoint (the aggregate row has endpoint ``all``)."""
    rows = []
    for p in result.points:
        parts = [p.aggregate] + (p.endpoints if len(p.endpoints) > 1 else [])
        for r in parts:
            s = r.server or {}
            rows.append({
                "model": p.model, "endpoint": r.endpoint, "protocol": p.protocol, "encoding": p.encoding,
                "policy": p.policy, "load": p.load, "arrivals": p.arrivals or "", "batch_size": p.batch_size,
                "stable": p.stable, "overloaded": p.overloaded, "aborted": p.aborted or "", "requests": r.requests, "seconds": round(r.seconds, 4),
                "throughput_rps": round(r.throughput_rps, 3), "infer_per_s": round(r.infer_per_s, 3),
                "latency_mean_ms": r.latency.mean_ms, "latency_p50_ms": r.latency.p50_ms,
                "latency_p90_ms": r.latency.p90_ms, "latency_p95_ms": r.latency.p95_ms,
                "latency_p99_ms": r.latency.p99_ms, "latency_max_ms": r.latency.max_ms,
                "send_lag_p50_ms": r.send_lag.p50_ms if r.send_lag else "",
                "send_lag_p99_ms": r.send_lag.p99_ms if r.send_lag else "", "unsent": r.unsent,
                "abandoned": r.abandoned,
                "error_count": r.error_count, "errors": ";".join(f"{k}={v}" for k, v in sorted(r.errors.items())),
                "server_request_us": s.get("request_us", ""), "server_queue_us": s.get("queue_us", ""),
                "server_compute_input_us": s.get("compute_input_us", ""),
                "server_compute_infer_us": s.get("compute_infer_us", ""),
                "server_compute_output_us": s.get("compute_output_us", ""),
                "server_avg_batch_size": s.get("avg_batch_size", ""),
                "client_successes_total": r.client_successes_total,
                "server_successes_total": "" if r.server_successes_total is None else r.server_successes_total,
                "client_cpu_us_per_request": round(p.client_cpu_us_per_request, 2)
                if math.isfinite(p.client_cpu_us_per_request) else "",
                **_metrics_cells(r),
            })  # fmt: skip
    return rows


def write_reports(result: RunResult, directory: Path, slo_p99_ms: float | None = None) -> list[Path]:
    """Write ``results.json``, ``results.csv`` and the PNG plots into ``directory``."""
    from pipeline.loadtest.plots import write_plots

    directory.mkdir(parents=True, exist_ok=True)
    payload = result.to_dict()
    if slo_p99_ms is not None:
        best = best_point(result.points, slo_p99_ms)
        payload["slo"] = {
            "p99_ms": slo_p99_ms,
            "met": best is not None,
            "best_point": None if best is None else {
                "model": best.model, "load": best.label, "infer_per_s": best.aggregate.infer_per_s,
                "p99_ms": best.aggregate.latency.p99_ms,
            },
        }  # fmt: skip
    json_path = directory / "results.json"
    json_path.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")
    csv_path = directory / "results.csv"
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_rows(result))
    return [json_path, csv_path, *write_plots(result.points, directory)]
