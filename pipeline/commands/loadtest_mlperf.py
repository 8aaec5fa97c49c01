"""`loadtest --scenario`: MLPerf Inference's scenarios, run by MLPerf's LoadGen against Triton through the load
test's HTTP engine (pipeline/loadtest/loadgen/). Each model's four LoadGen logs go to ``<report-dir>/mlperf/<model>/``;
the verdicts (VALID or INVALID, the scenario's metric, the reasons) to ``mlperf.json`` and ``mlperf.csv`` beside them.

``--mode accuracy`` runs LoadGen's AccuracyOnly over the evaluation data instead, each request batch one sample: the
answers LoadGen logged are judged as ``verify`` judges served outputs (pipeline.triton.verify, the same gates per
output kind against served FP32 and the labels), its report in ``mlperf_accuracy.json``; ``--accuracy-target`` adds
MLPerf's rule (the variant's task metric ≥ 99 % or 99.9 % of FP32's)."""

from __future__ import annotations

import argparse
import csv
import json
import logging
from pathlib import Path
from typing import Any

from pipeline.accuracy.gates import Gates, accuracy_share
from pipeline.core.errors import EXIT_CHECK_FAILED, CheckFailed, require
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
                    "min_query_count", "mlperf_conf", "user_conf", "conf_model", "accuracy_target", "fp16_max_drop", "int8_max_drop",
                    "gate_confidence", "repository")  # accuracy mode reads the served model files: the repository as the pod sees it


def add_scenario_options(p: argparse.ArgumentParser) -> None:
    """The ``MLPerf scenario`` option group of ``loadtest``."""
    g = p.add_argument_group("MLPerf scenario (MLPerf's LoadGen drives the load instead of a sweep)")
    g.add_argument("--scenario", choices=SCENARIOS, help="single-stream (p90 latency), multi-stream (p99 per-query latency of "
                   "--samples-per-query samples), server (Poisson arrivals at --target-qps; VALID only when p99 ≤ "
                   "--latency-bound-ms) or offline (every sample at once; throughput)")
    g.add_argument("--mode", choices=["performance", "accuracy"], default="performance",
                   help="performance, or accuracy: LoadGen's AccuracyOnly over the evaluation data, each request batch "
                        "(--batch-size) one sample, its logged answers judged by verify's gates (default: %(default)s)")
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
    a = p.add_argument_group("MLPerf accuracy mode (--mode accuracy: the gates of verify)")
    a.add_argument("--accuracy-target", type=_share, metavar="SHARE", help="MLPerf's rule, e.g. 99%% or 99.9%%: each variant's task "
                   "metric against the labels at least this share of served FP32's; reported beside the drop gates, failing below it")
    gates = Gates()
    a.add_argument("--fp16-max-drop", type=float, metavar="POINTS", help=f"as verify's (default: {gates.fp16_max_drop:g})")
    a.add_argument("--int8-max-drop", type=float, metavar="POINTS", help=f"as verify's (default: {gates.int8_max_drop:g})")
    a.add_argument("--gate-confidence", type=float, metavar="C", help=f"as verify's (default: {gates.gate_confidence:g})")


def _share(text: str) -> float:
    from pipeline.core.errors import PipelineError

    try:
        return accuracy_share(text)
    except PipelineError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def scenario_settings(args: argparse.Namespace) -> ScenarioSettings | None:
    """The LoadGen run ``args`` ask for, checked; None without ``--scenario``."""
    if args.scenario is None:
        return None
    quick = args.mlperf_conf is None and args.user_conf is None
    if quick:
        needs_qps = ("server", "offline") if args.mode == "performance" else ("server",)  # accuracy: Offline sends every sample at once anyway
        require(args.scenario not in needs_qps or args.target_qps is not None,
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


def scenario_gates(args: argparse.Namespace) -> Gates:
    """The drop limits and confidence an accuracy run is judged with, checked; the accuracy options are refused where
    nothing would judge by them (no ``--scenario``, or a performance run)."""
    given = {k: getattr(args, k) for k in ("fp16_max_drop", "int8_max_drop", "gate_confidence") if getattr(args, k) is not None}
    judging = [f"--{k.replace('_', '-')}" for k in ("accuracy_target", *given) if getattr(args, k) is not None]
    require(args.scenario is not None or args.mode == "performance", "--mode accuracy is a mode of an MLPerf scenario",
            "add --scenario (e.g. --scenario offline --mode accuracy)")
    require(args.mode == "accuracy" or not judging, f"{', '.join(judging)} judge an accuracy run; a performance run would ignore them",
            "add --scenario S --mode accuracy, or leave them out")
    for name in ("fp16_max_drop", "int8_max_drop"):
        require(given.get(name, 0) >= 0, f"--{name.replace('_', '-')} cannot be negative", "e.g. 1.0 (points)")
    confidence = given.get("gate_confidence", 0.95)
    require(0.5 <= confidence <= 0.999, f"--gate-confidence {confidence:g} is out of range (0.5 to 0.999)", "e.g. 0.95")
    return Gates(**given)


def run_scenarios(settings: LoadTestSettings, scenario: ScenarioSettings, report_dir: Path, console: Any, gates: Gates | None = None,
                  accuracy_target: float | None = None) -> int:
    """Run ``scenario`` for each model of ``settings`` on its first endpoint; write the logs and the verdicts; 0 when
    every run is VALID (in accuracy mode: every verified model passes ``gates``), 1 otherwise."""
    from pipeline.core.tables import to_rich
    from pipeline.loadtest.loadgen.http_sut import TritonSut
    from pipeline.loadtest.loadgen.report import mlperf_data
    from pipeline.loadtest.loadgen.run import run_scenario
    from pipeline.loadtest.runner import model_spec, new_run

    require(len(settings.endpoints) == 1 and settings.protocol == "http" and settings.shared_memory == "none" and settings.workers == 1,
            "--scenario drives one HTTP endpoint from one process", "pass one --url, without --protocol grpc, --shared-memory or --workers")
    if scenario.mode == "accuracy":
        return run_accuracy(settings, scenario, report_dir, console, gates, accuracy_target)
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
    console.print(to_rich(mlperf_data(rows)))
    console.print(f"reports: {report_dir / 'mlperf.json'}, {report_dir / 'mlperf.csv'}; LoadGen's logs: "
                  + ", ".join(str(report_dir / "mlperf" / r["model"]) for r in rows))
    invalid = [r for r in rows if r["result"] != "VALID"]
    for row in invalid:
        log.error("%s: %s INVALID: %s", row["model"], row["scenario"], "; ".join(row["reasons"]) or "see mlperf_log_summary.txt")
    return EXIT_CHECK_FAILED if invalid else 0


def run_accuracy(settings: LoadTestSettings, scenario: ScenarioSettings, report_dir: Path, console: Any, gates: Gates | None = None,
                 accuracy_target: float | None = None) -> int:
    """LoadGen's accuracy mode of ``scenario`` for each model of ``settings``, judged as ``verify`` judges: the logs in
    ``<report-dir>/mlperf/<model>/``, the judgement in ``mlperf_accuracy.json``, a row per model in ``mlperf.json``;
    0 when every verified model passes, 1 otherwise."""
    from pipeline.core.options import DEFAULT_REPOSITORY
    from pipeline.core.tables import to_rich
    from pipeline.data.raw_files import is_image_folder, is_text_file
    from pipeline.loadtest.loadgen.accuracy import outputs_through_loadgen
    from pipeline.loadtest.runner import new_run
    from pipeline.reports.build_tables import served_data
    from pipeline.triton.served_gate import SERVED_ATOL
    from pipeline.triton.verify import verify_repository

    require(settings.data is None or not (is_image_folder(settings.data) or is_text_file(settings.data)),
            "--mode accuracy judges tensors against FP32: raw files have no in-process reference here", "pass --data with an .npz, or leave it out")
    models = new_run(settings).settings["models"]
    endpoint = settings.endpoints[0]
    runs: dict[str, Any] = {}
    times: dict[str, int] = {}

    def through_loadgen(_url: str, model: str, data: Any, outputs: Any, batch_size: int) -> list[Any]:
        times[model] = times.get(model, 0) + 1
        name = model if times[model] == 1 else f"{model}.{times[model]}"  # FP32 again, on a uint8-input variant's values
        served, runs[name] = outputs_through_loadgen(scenario, model, endpoint, data.batches(batch_size), outputs, report_dir / "mlperf" / name,
                                                     timeout_s=settings.timeout_s, max_connections=settings.max_connections)
        return served

    repository = settings.repository or DEFAULT_REPOSITORY
    given = {}
    if settings.data is not None:
        from pipeline.data.artifacts import parse_variant

        given = {(parse_variant(m) or (m, ""))[0]: settings.data for m in models}
    report_path = report_dir / "mlperf_accuracy.json"
    failed: CheckFailed | None = None
    try:
        verify_repository(repository, url=endpoint.address, models=models, calibration_root=settings.calibration_dir, eval_data=given,
                          batch_size=settings.batch_size, atol=SERVED_ATOL, gates=gates or Gates(), report_path=report_path, collect=through_loadgen,
                          accuracy_target=accuracy_target, show=lambda rows: console.print(to_rich(served_data(rows))))
    except CheckFailed as exc:
        failed = exc
    judged = json.loads(report_path.read_text())
    rows = [_accuracy_row(m, runs.get(m["model"]), scenario) for m in judged["models"]]
    rows += [{"model": name, "scenario": scenario.scenario, "mode": "accuracy", "result": "NOT VERIFIED", "reasons": [why], "logs": ""}
             for name, why in sorted(judged["not_verified"].items())]
    _write(rows, report_dir)
    from pipeline.loadtest.loadgen.report import mlperf_data

    console.print(to_rich(mlperf_data(rows)))
    console.print(f"reports: {report_path}, {report_dir / 'mlperf.json'}; LoadGen's logs: {report_dir / 'mlperf'}")
    if failed is not None:
        raise failed
    return 0


def _accuracy_row(judged: dict[str, Any], verdict: ScenarioVerdict | None, scenario: ScenarioSettings) -> dict[str, Any]:
    """One model's ``mlperf.json`` row in accuracy mode: PASS or FAIL by the gates, the failures as reasons, the served
    task metric of each output."""
    metrics = {name: out["served_metric"] if out["served_metric"] is not None else out["agreement"] for name, out in judged["outputs"].items()}
    return {"model": judged["model"], "scenario": verdict.scenario if verdict else scenario.scenario, "mode": "accuracy",
            "result": "PASS" if judged["passed"] else "FAIL", "metric": "served task metric (accuracy, R², mIoU; agreement without labels)",
            "value": metrics, "unit": "", "samples": judged["samples"], "query_count": None, "reasons": judged["failures"], "notes": judged["notes"],
            "logs": f"mlperf/{judged['model']}"}


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
