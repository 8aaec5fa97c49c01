"""Load-test reports: a rich table for the screen, ``results.json``, ``results.csv`` and plots."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from pipeline.core.tables import TableData, to_rich
from pipeline.loadtest.results import EndpointResult, PointResult, RunResult, best_point

CSV_FIELDS = (
    "model", "endpoint", "protocol", "encoding", "policy", "load", "arrivals", "batch_size", "stable", "overloaded", "aborted",
    "requests", "seconds", "throughput_rps", "infer_per_s",
    "latency_mean_ms", "latency_p50_ms", "latency_p90_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms",
    "send_lag_p50_ms", "send_lag_p99_ms", "unsent", "abandoned", "error_count", "errors",
    "server_request_us", "server_queue_us", "server_compute_input_us", "server_compute_infer_us",
    "server_compute_output_us", "server_avg_batch_size", "client_successes_total", "server_successes_total",
    "client_cpu_us_per_request",
    "metrics_seconds", "metrics_inferences", "metrics_infer_per_s", "metrics_executions", "metrics_failure", "metrics_request_us", "metrics_queue_us",
    "metrics_compute_infer_us", "metrics_cpu_utilization", "metrics_gpu_utilization", "metrics_gpu_memory_used_bytes", "metrics_note",
)  # fmt: skip


def points_data(result: RunResult, slo_p99_ms: float | None = None) -> TableData:
    """Every point (aggregate rows, then one row per endpoint if several); the best point meeting the SLO marked."""
    several = len(result.settings.get("endpoints", [])) > 1
    t = TableData(f"Triton load test — {result.settings['protocol']} ({result.points[0].encoding if result.points else ''}); "
                  f"infer/s, latency and Triton's breakdown over each point's {result.settings.get('stability', 'measured windows').split(' within')[0]}", [
        "model", "load", "infer/s", "p50 ms", "p90", "p95", "p99", "max", "errors", "queue µs",
        "in µs", "infer µs", "out µs", "batch", "client µs/req", "stable",
    ])  # fmt: skip
    best = best_point(result.points, slo_p99_ms) if slo_p99_ms is not None else None
    for point in result.points:
        t.add(_cells(point, point.aggregate, point.model), "best" if point is best else ("bad" if point.aborted or point.aggregate.error_count else ""))
        if several:
            for e in point.endpoints:
                t.add(_cells(point, e, f"  └ {e.endpoint}"), "dim")
    return t


def table(result: RunResult, slo_p99_ms: float | None = None) -> Any:
    """:func:`points_data` as a ``rich.table.Table``."""
    return to_rich(points_data(result, slo_p99_ms))


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


def metrics_data(result: RunResult) -> TableData:
    """Triton's Prometheus metrics per point (aggregate rows); the caption says why figures are missing."""
    t = TableData("Triton Prometheus metrics over each whole point: warm-up, windows and drain (/metrics deltas, gauges at the end)", [
        "model", "load", "seconds", "inferences", "infer/s", "executions", "batch", "failures", "request µs", "queue µs",
        "infer µs", "CPU util", "GPU util", "GPU memory",
    ])  # fmt: skip
    notes = []
    for point in result.points:
        m = point.aggregate.metrics
        if m is None:
            notes.append(point.aggregate.metrics_note)
            t.add([point.model, point.label] + ["—"] * (len(t.columns) - 2))
            continue
        gpus = m.get("gpus") or []
        if not gpus:
            notes.append(str(m.get("gpu_note", "")))
        util = [g["utilization"] for g in gpus if g.get("utilization") is not None]
        used = sum(g["memory_used_bytes"] or 0 for g in gpus)
        total = sum(g["memory_total_bytes"] or 0 for g in gpus)
        t.add([
            point.model, point.label, _num(m.get("seconds"), 1), _num(m["inferences"], 0), _num(m.get("infer_per_s"), 1),
            _num(m["executions"], 0), _num(m["avg_batch_size"], 2),
            _num(m["failure"], 0), _num(m["request_us"], 0), _num(m["queue_us"], 0), _num(m["compute_infer_us"], 0),
            "—" if m.get("cpu_utilization") is None else f"{m['cpu_utilization']:.0%}",
            f"{sum(util) / len(util):.0%}" if util else "—",
            f"{used / 2**30:.1f}/{total / 2**30:.1f} GiB" if total else "—",
        ])  # fmt: skip
    t.caption = "; ".join(dict.fromkeys(n for n in notes if n))
    return t


def steps_data(result: RunResult) -> TableData | None:
    """Each ensemble point's per-step server times (Triton's statistics of each composing model over the point), or None
    when no point is of an ensemble."""
    rows = [(p, step, s) for p in result.points for step, s in (p.steps or {}).items()]
    if not rows:
        return None
    t = TableData("Triton's time per ensemble step (each composing model's statistics over the point, µs per request)",
                  ["model", "load", "step", "requests", "queue µs", "in µs", "infer µs", "out µs", "batch"], left=3)
    for point, step, s in rows:
        t.add([point.model, point.label, step, str(s.get("success_count", "")), _num(s.get("queue_us"), 0), _num(s.get("compute_input_us"), 0),
               _num(s.get("compute_infer_us"), 0), _num(s.get("compute_output_us"), 0), _num(s.get("avg_batch_size"), 2)])
    return t


def metrics_table(result: RunResult) -> Any:
    """:func:`metrics_data` as a ``rich.table.Table``."""
    return to_rich(metrics_data(result))


def _metrics_cells(r: EndpointResult) -> dict[str, Any]:
    m = r.metrics or {}
    gpus = m.get("gpus") or []
    util = [g["utilization"] for g in gpus if g.get("utilization") is not None]
    return {
        "metrics_seconds": _blank(m.get("seconds")), "metrics_inferences": m.get("inferences", ""),
        "metrics_infer_per_s": _blank(m.get("infer_per_s")), "metrics_executions": m.get("executions", ""),
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
