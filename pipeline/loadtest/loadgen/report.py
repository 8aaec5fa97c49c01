"""The verdicts of LoadGen runs as one table (``mlperf.json``'s rows): for the terminal and the HTML page alike."""

from __future__ import annotations

from typing import Any

from pipeline.core.tables import TableData


def mlperf_data(rows: list[dict[str, Any]]) -> TableData:
    """One row per run: the scenario, LoadGen's result (VALID/INVALID; PASS/FAIL by the gates in accuracy mode), the
    scenario's metric, p50/p99 and the queries, and the reasons of a run that is not VALID or did not pass."""
    table = TableData("MLPerf scenarios (LoadGen)", ["model", "scenario", "mode", "result", "metric", "p50 ms", "p99 ms", "queries", "reasons"],
                      align="lllllrrrl")
    for r in rows:
        p = r.get("percentiles_ns") or {}
        good = r["result"] in ("VALID", "PASS")
        table.add([r["model"], str(r["scenario"]), str(r.get("mode", "")), r["result"], _metric(r), _ms(p.get("50.00")), _ms(p.get("99.00")),
                   "—" if r.get("query_count") is None else f"{r['query_count']:,}", "; ".join(r.get("reasons") or [])],
                  "" if good else "bad")
    return table


def _metric(r: dict[str, Any]) -> str:
    value = r.get("value")
    if isinstance(value, dict):  # accuracy mode: each output's served task metric
        shown = ", ".join(f"{name} {v:.2%}" for name, v in value.items() if v is not None) or "—"
        return f"{shown} on {r['samples']:,} samples" if r.get("samples") else shown
    if value is None:
        return "—"
    shown = f"{value / 1e6:.3f} ms" if r.get("unit") == "ns" else f"{value:,.1f} {r.get('unit', '')}"
    return f"{r['metric']}: {shown}"


def _ms(ns: float | None) -> str:
    return "—" if ns is None else f"{ns / 1e6:.3f}"
