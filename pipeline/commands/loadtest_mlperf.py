"""`loadtest --scenario`: MLPerf Inference's scenarios, run by MLPerf's LoadGen against Triton through the load
test's HTTP engine (pipeline/loadtest/loadgen/). Each model's four LoadGen logs go to ``<report-dir>/mlperf/<model>/``;
the verdicts (VALID or INVALID, the scenario's metric, the reasons) to ``mlperf.json`` and ``mlperf.csv`` beside them."""

from __future__ import annotations

import argparse
import csv
import json
import logging
from pathlib import Path
from typing import Any

from pipeline.core.errors import EXIT_CHECK_FAILED, require
from pipeline.loadtest.loadgen.settings import SCENARIOS, ScenarioSettings
from pipeline.loadtest.loadgen.verdict import ScenarioVerdict
from pipeline.loadtest.runner import LoadTestSettings

log = logging.getLogger(__name__)

# Without LoadGen's conf files, runs short enough to iterate on (MLPerf's own minimum is 600 s: pass --min-duration-s
# 600, or its mlperf.conf). LoadGen generates its queries up front from the expected latency: expecting faster than
# the server answers only generates queries the run does not use; expecting slower ends it early, INVALID.
QUICK_MIN_DURATION_S = 10.0
QUICK_EXPECTED_LATENCY_MS = 0.1
# what a --k8s-job pod repeats of a scenario run
SCENARIO_OPTIONS = ("scenario", "mode", "target_qps", "latency_bound_ms", "expected_latency_ms", "samples_per_query", "min_duration_s",
                    "min_query_count", "mlperf_conf", "user_conf", "conf_model")


def add_scenario_options(p: argparse.ArgumentParser) -> None:
    """The ``MLPerf scenario`` option group of ``loadtest``."""
    g = p.add_argument_group("MLPerf scenario (MLPerf's LoadGen drives the load instead of a sweep)")
    g.add_argument("--scenario", choices=SCENARIOS, help="single-stream (p90 latency), multi-stream (p99 per-query latency of "
                   "--samples-per-query samples), server (Poisson arrivals at --target-qps; VALID only when p99 ≤ "
                   "--latency-bound-ms) or offline (every sample at once; throughput)")
    g.add_argument("--mode", choices=["performance"], default="performance", help="LoadGen's test mode (default: %(default)s)")
    g.add_argument("--target-qps", type=float, metavar="QPS", help="server: the Poisson arrival rate; offline: the expected throughput")
    g.add_argument("--latency-bound-ms", type=float, metavar="MS", help="server: the bound p99 must keep (MLPerf's target latency)")
    g.add_argument("--expected-latency-ms", type=float, metavar="MS",
                   help=f"single- and multi-stream: how long a query is expected to take (default without conf files: {QUICK_EXPECTED_LATENCY_MS:g})")
    g.add_argument("--samples-per-query", type=int, metavar="N", help="multi-stream: samples per query (MLPerf: 8)")
    g.add_argument("--min-duration-s", type=float, metavar="SECONDS",
                   help=f"shortest run (default without conf files: {QUICK_MIN_DURATION_S:g}; MLPerf's: 600)")
    g.add_argument("--min-query-count", type=int, metavar="N", help="fewest queries of a run")
    g.add_argument("--mlperf-conf", type=Path, metavar="FILE", help="LoadGen's mlperf.conf (MLPerf's rules per model and scenario)")
    g.add_argument("--user-conf", type=Path, metavar="FILE", help="LoadGen's user.conf (this system's settings); flags given override it")
    g.add_argument("--conf-model", default="*", metavar="NAME", help="the model name the conf files' lines match (default: %(default)s)")


def scenario_settings(args: argparse.Namespace) -> ScenarioSettings | None:
    """The LoadGen run ``args`` ask for, checked; None without ``--scenario``."""
    if args.scenario is None:
        return None
    quick = args.mlperf_conf is None and args.user_conf is None
    if quick:
        require(args.scenario not in ("server", "offline") or args.target_qps is not None,
                f"--scenario {args.scenario} needs --target-qps (the {'Poisson arrival rate' if args.scenario == 'server' else 'expected throughput'})",
                "pass --target-qps, or --user-conf with a file that sets target_qps")
        require(args.scenario != "server" or args.latency_bound_ms is not None, "--scenario server needs --latency-bound-ms",
                "pass the p99 bound, e.g. --latency-bound-ms 15 (MLPerf's ResNet50 bound), or --user-conf")
    stream = args.scenario in ("single-stream", "multi-stream")
    return ScenarioSettings(
        scenario=args.scenario, mode=args.mode, target_qps=args.target_qps, latency_bound_ms=args.latency_bound_ms,
        expected_latency_ms=args.expected_latency_ms if args.expected_latency_ms is not None or not (quick and stream) else QUICK_EXPECTED_LATENCY_MS,
        samples_per_query=args.samples_per_query, min_query_count=args.min_query_count,
        min_duration_s=args.min_duration_s if args.min_duration_s is not None or not quick else QUICK_MIN_DURATION_S,
        mlperf_conf=args.mlperf_conf, user_conf=args.user_conf, conf_model=args.conf_model,
    )


def run_scenarios(settings: LoadTestSettings, scenario: ScenarioSettings, report_dir: Path, console: Any) -> int:
    """Run ``scenario`` for each model of ``settings`` on its first endpoint; write the logs and the verdicts; 0 when
    every run is VALID, 1 otherwise."""
    from pipeline.loadtest.loadgen.http_sut import TritonSut
    from pipeline.loadtest.loadgen.run import run_scenario
    from pipeline.loadtest.runner import model_spec, new_run

    require(len(settings.endpoints) == 1 and settings.protocol == "http" and settings.shared_memory == "none" and settings.workers == 1,
            "--scenario drives one HTTP endpoint from one process", "pass one --url, without --protocol grpc, --shared-memory or --workers")
    models = new_run(settings).settings["models"]
    rows: list[dict[str, Any]] = []
    for model in models:
        ((endpoint, payloads),) = model_spec(settings, model).targets
        sut = TritonSut(model, endpoint, payloads, scenario.scenario, timeout_s=settings.timeout_s, max_connections=settings.max_connections)
        sut.start()
        try:
            verdict = run_scenario(scenario, sut, len(payloads), report_dir / "mlperf" / model)
        finally:
            sut.stop()
        rows.append(_row(model, verdict, sut.engine.recorder.errors))
    _write(rows, report_dir)
    console.print(_table(rows))
    console.print(f"reports: {report_dir / 'mlperf.json'}, {report_dir / 'mlperf.csv'}; LoadGen's logs: "
                  + ", ".join(str(report_dir / "mlperf" / r["model"]) for r in rows))
    invalid = [r for r in rows if r["result"] != "VALID"]
    for row in invalid:
        log.error("%s: %s INVALID: %s", row["model"], row["scenario"], "; ".join(row["reasons"]) or "see mlperf_log_summary.txt")
    return EXIT_CHECK_FAILED if invalid else 0


def _row(model: str, verdict: ScenarioVerdict, errors: dict[str, int]) -> dict[str, Any]:
    return {"model": model, **verdict.to_dict(), "client_errors": dict(errors), "logs": f"mlperf/{model}"}


def _write(rows: list[dict[str, Any]], report_dir: Path) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "mlperf.json").write_text(json.dumps({"runs": rows}, indent=2) + "\n")
    fields = ["model", "scenario", "mode", "result", "metric", "value", "unit", "query_count", "reasons", "logs"]
    with open(report_dir / "mlperf.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**r, "reasons": "; ".join(r["reasons"])} for r in rows)


def _table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="MLPerf scenarios (LoadGen)")
    for column in ("model", "scenario", "result", "metric", "p50 ms", "p99 ms", "queries"):
        table.add_column(column)
    for r in rows:
        value = "—" if r["value"] is None else (f"{r['value'] / 1e6:.3f} ms" if r["unit"] == "ns" else f"{r['value']:,.1f} {r['unit']}")
        p = r["percentiles_ns"]
        table.add_row(r["model"], r["scenario"], r["result"], f"{r['metric']}: {value}", _ms(p.get("50.00")), _ms(p.get("99.00")),
                      str(r["query_count"]))
    return table


def _ms(ns: float | None) -> str:
    return "—" if ns is None else f"{ns / 1e6:.3f}"

