"""`python -m pipeline loadtest`: measure latency and throughput of a real Triton server."""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core.errors import EXIT_CHECK_FAILED, PipelineError, require, require_creatable
from pipeline.core.objectstore import S3Url
from pipeline.core.options import CALIBRATION_ROOT, DEFAULT_REPOSITORY, repository_arg
from pipeline.commands.loadtest_mlperf import SCENARIO_OPTIONS, add_scenario_options, run_scenarios, scenario_gates, scenario_settings
from pipeline.loadtest.client import Endpoint, endpoint_from_url
from pipeline.loadtest.measure import WindowSettings
from pipeline.loadtest.metrics import default_metrics_endpoint
from pipeline.loadtest.payload import ENCODINGS, eval_data_path
from pipeline.loadtest.policy import ARRIVALS, policies_from_options
from pipeline.loadtest.results import RunResult, best_point, unstable_hint
from pipeline.loadtest.runner import PROTOCOLS, LoadTestSettings, run_loadtest
from pipeline.loadtest.shm import SHARED_MEMORY
from pipeline.reports.dirs import REPORT_DIR_HELP, PageRefresher, run_report_dirs

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction, refresh_page: PageRefresher | None = None) -> None:
    """Add the ``loadtest`` command; ``refresh_page`` updates the HTML page after it (None: no page)."""
    p = subparsers.add_parser(
        "loadtest",
        help="measure latency and throughput of Triton (closed-loop concurrency sweep or open-loop request rate)",
        description=(
            "Load-test Triton the way perf_analyzer does: for each load point, warm up, then run measurement "
            "windows until the last 3 agree (throughput and mean latency within 10%), bounded by --max-seconds. "
            "Requests are real samples from calibration/<model>/eval.npz, encoded once before the run and checked "
            "against tritonclient. The HTTP generator is an epoll loop over keep-alive connections costing ~20-40 µs "
            "of client CPU per request under load, kernel included (wrk: ~15-20; reported per point), so it measures the server, not itself. Each point reports "
            "throughput, client latency percentiles, errors by kind, and Triton's own breakdown from its statistics "
            "extension (queue, compute input/infer/output, average batch size) over the same windows.\n\n"
            "Without --url the embedded tritonserver is started on --repository, every served variant is measured, "
            "and the server is stopped. Reports go to <workdir>/reports/<timestamp>/ (or --report-dir): results.json, results.csv, PNG plots and the HTML page."
        ),
        epilog=(
            "load policies:\n"
            "  closed loop (default)  --concurrency 1,2,4,8,16,32: that many requests in flight per endpoint\n"
            "  open loop              --request-rate 200,400: requests/s per endpoint, sent on schedule whatever the\n"
            "                         server does; latency counts from each request's SCHEDULED time, so a server\n"
            "                         that falls behind shows its queueing (no coordinated omission)\n"
            "\nexamples:\n"
            "  python -m pipeline loadtest                                   # embedded server, all variants\n"
            "  python -m pipeline loadtest --model digits_int8 --concurrency 1,8,32 --batch-size 8\n"
            "  python -m pipeline loadtest --url 127.0.0.1:8000 --request-rate 500,1000 --arrivals poisson\n"
            "  python -m pipeline loadtest --url 127.0.0.1:8000 --url 127.0.0.1:8003   # one per MIG slice\n"
            "  python -m pipeline loadtest --slo-p99-ms 5                    # exit 1 unless a point meets p99 ≤ 5 ms\n"
            "  python -m pipeline loadtest --scenario server --target-qps 200 --latency-bound-ms 15   # MLPerf's LoadGen\n"
            "\nexit status: 0 all points ran without errors (and the SLO, if given, was met); 1 errors, a dead\n"
            "server, or no point meeting the SLO (reports are still written); 2 a usage or setup problem.\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = p.add_argument_group("target")
    target.add_argument("--url", action="append", default=[], metavar="HOST:PORT",
                        help="HTTP address of a running Triton; repeat for several endpoints (e.g. one per MIG slice): "
                             "each gets the full load, results are aggregated and per endpoint. "
                             "Default: start the embedded server on --repository")
    target.add_argument("--grpc-url", action="append", default=[], metavar="HOST:PORT",
                        help="with --url and --protocol grpc: the gRPC address of each --url, in the same order")
    target.add_argument("--metrics-url", action="append", default=[], metavar="HOST:PORT",
                        help="with --url: Triton's Prometheus metrics address of each --url, in the same order "
                             "(default: the --url host at its port + 2, Triton's 8000/8002 layout)")
    target.add_argument("--repository", type=repository_arg, default=None, metavar="DIR|URL",
                        help=f"model repository (a folder or s3://BUCKET/PREFIX) for the embedded server (default: {DEFAULT_REPOSITORY}); with --url, the "
                             "repository that server serves, read for what only the model files say (a --uint8-input "
                             "variant's scale)")
    target.add_argument("--model", action="append", default=[], metavar="NAME",
                        help="Triton model to test; repeat for several (default: every ready model)")
    req = p.add_argument_group("requests")
    req.add_argument("--batch-size", type=int, default=1, help="samples per request; infer/s = requests/s × this (default: %(default)s)")
    req.add_argument("--protocol", choices=PROTOCOLS, default="http",
                     help="http: HTTP/1.1 keep-alive connections; grpc: gRPC over one HTTP/2 connection per endpoint, "
                          "requests serialized once — both driven by one epoll loop, client CPU per request reported per "
                          "point (default: %(default)s)")
    req.add_argument("--encoding", choices=ENCODINGS, default="binary",
                     help="HTTP body: binary tensor extension (JSON header + raw tensor bytes, outputs binary) or plain "
                          "JSON (default: %(default)s)")
    req.add_argument("--shared-memory", choices=SHARED_MEMORY, default="none",
                     help="tensors through shared memory registered with Triton, over HTTP or gRPC (as perf_analyzer's "
                          "option): system = /dev/shm, cuda = GPU memory by CUDA IPC (needs cuda-python and a GPU); the "
                          "server must run on this machine. Inputs are written once, requests carry only region names; "
                          "regions are unregistered and removed on exit, Ctrl-C included (default: %(default)s)")
    req.add_argument("--output-shared-memory-size", type=int, metavar="BYTES",
                     help="with --shared-memory: bytes of each output's region (default: what the model's output shape "
                          "takes at --batch-size; required for outputs of variable size)")
    req.add_argument("--data", type=Path, metavar="NPZ|FOLDER|CSV",
                     help="samples to send, one array per input name (default: <calibration-root>/<model>/eval.npz); or raw "
                          "inputs for a raw-input ensemble (build --raw-inputs), whose per-step server times are reported: a folder "
                          "of JPEG/PNG files (one file per request), or a CSV/text file of sentences (--batch-size per request)")
    req.add_argument("--calibration-root", type=Path, default=CALIBRATION_ROOT,
                     help="where <model>/eval.npz lives; variants digits_fp16, digits_int8_trt use digits/ (default: %(default)s)")
    req.add_argument("--timeout-ms", type=float, default=5000, help="a request without response after this counts as a timeout (default: %(default)g)")
    load = p.add_argument_group("load policy")
    load.add_argument("--concurrency", metavar="N[,N...]", help="closed-loop sweep (default: 1,2,4,8,16,32)")
    load.add_argument("--request-rate", metavar="R[,R...]", help="open-loop request rates in requests/s per endpoint")
    load.add_argument("--arrivals", choices=ARRIVALS, default="constant", help="open-loop spacing of requests (default: %(default)s)")
    load.add_argument("--seed", type=int, default=0, help="seed of the Poisson schedule (default: %(default)s)")
    load.add_argument("--workers", type=int, default=1, metavar="N",
                      help="load-generating processes on this machine, started together: the concurrency (or rate) is "
                           "split across them and every latency sample goes into one report, so percentiles are exact; "
                           "one process drives about one core (default: %(default)s)")
    load.add_argument("--max-connections", type=int, default=256,
                      help="open loop: connections per endpoint at most; beyond that requests wait in the client's "
                           "backlog, still timed from their scheduled time (default: %(default)s)")
    meas = p.add_argument_group("measurement")
    meas.add_argument("--window-ms", type=float, default=1000, help="length of a measurement window (default: %(default)g)")
    meas.add_argument("--warmup-ms", type=float, default=1000, help="load before the first window, not measured (default: %(default)g)")
    meas.add_argument("--max-seconds", type=float, default=30, help="bound per load point, warm-up included; an unstable point "
                      "is reported as such when it is reached (default: %(default)g)")
    meas.add_argument("--restart-wait-s", type=float, default=0, metavar="SECONDS",
                      help="how long a point waits for a server that went away to come back (a supervised `serve` restarts "
                           "a crashed one) instead of ending; windows in which it went away or restarted are named in the "
                           "report and left out of stability and percentiles (default: %(default)g, end the point at once)")
    meas.add_argument("--stability-percentage", type=float, default=10,
                      help="the last 3 windows' throughput and mean latency must lie within this %% of their mean (default: %(default)g)")
    dist = p.add_argument_group("distributed (several machines: one shard per machine, merged afterwards)")
    dist.add_argument("--shard", metavar="I/N", help="run shard I of N: 1/N of every point's load, on the schedule that "
                      "--start-at fixes for all shards, writing raw results to --shard-output instead of reports")
    dist.add_argument("--start-at", metavar="TIME", help="wall-clock start of the first point, the same for every shard: "
                      "ISO 8601 with a zone (2026-12-01T21:00:00Z), epoch seconds, +SECONDS from now, or ready+SECONDS: "
                      "SECONDS after the last shard is ready (a barrier on the shared --shard-output folder)")
    dist.add_argument("--shard-output", type=Path, metavar="DIR", help="with --shard: where shard-<i>-of-<n>.npz is written")
    dist.add_argument("--merge", type=Path, nargs="+", metavar="PATH",
                      help="merge shard files (or folders of them) into one report with exact percentiles; runs no load")
    dist.add_argument("--k8s-job", type=Path, metavar="DIR", help="write a Kubernetes Indexed Job (one pod per shard, "
                      "against --url, e.g. the Triton Service) and its results volume claim into DIR; runs no load")
    dist.add_argument("--pods", type=int, help="with --k8s-job: shards, one pod each (default: 2; a --scenario runs in 1)")
    dist.add_argument("--image", default="", help="with --k8s-job: an image with this project (and the evaluation data) installed")
    dist.add_argument("--job-name", default="triton-loadtest", help="with --k8s-job: the Job's name (default: %(default)s)")
    dist.add_argument("--results-claim", default="triton-loadtest-results",
                      help="with --k8s-job: the ReadWriteMany PersistentVolumeClaim the pods write to (default: %(default)s)")
    add_scenario_options(p)
    out = p.add_argument_group("output")
    out.add_argument("--slo-p99-ms", type=float, metavar="MS", help="exit 1 when no point has p99 ≤ MS (and no errors); name the best one that does")
    out.add_argument("--report-dir", type=Path, help=REPORT_DIR_HELP.format(run="<timestamp>"))
    out.add_argument("--workdir", type=Path, default=Path("build"),
                     help="server logs (<workdir>/triton), the reports folder and the builds the page shows (default: %(default)s)")
    p.set_defaults(handler=run, refresh_page=refresh_page)


def settings_from_args(
    args: argparse.Namespace, endpoints: list[Endpoint], grpc_endpoints: list[Endpoint], models: list[str], metrics: list[Endpoint] | None = None
) -> LoadTestSettings:
    """Validate the options and gather them."""
    require(args.batch_size >= 1, f"--batch-size must be at least 1, got {args.batch_size}", "e.g. --batch-size 8")
    require(args.window_ms >= 10, f"--window-ms {args.window_ms:g} is too short to measure anything", "use 500 or more")
    require(args.warmup_ms >= 0, "--warmup-ms cannot be negative", "use 0 to skip the warm-up")
    require(args.timeout_ms > 0, "--timeout-ms must be positive", "e.g. --timeout-ms 5000")
    require(args.max_connections >= 1, "--max-connections must be at least 1", "e.g. --max-connections 256")
    require(args.output_shared_memory_size is None or args.output_shared_memory_size > 0,
            "--output-shared-memory-size must be positive", "e.g. --output-shared-memory-size 1048576")
    require(args.restart_wait_s >= 0, "--restart-wait-s cannot be negative", "use 0 to end a point when the server is gone")
    require(args.workers >= 1, f"--workers must be at least 1, got {args.workers}", "e.g. --workers 2")
    require(0 < args.stability_percentage < 100, "--stability-percentage must be between 0 and 100", "e.g. 10")
    minimum = (args.warmup_ms + 3 * args.window_ms) / 1000
    require(args.max_seconds >= minimum,
            f"--max-seconds {args.max_seconds:g} leaves no room for the warm-up and 3 windows ({minimum:g} s)",
            f"use --max-seconds {minimum:g} or more, or shorter --window-ms")
    windows = WindowSettings(
        window_s=args.window_ms / 1000,
        warmup_s=args.warmup_ms / 1000,
        max_s=args.max_seconds,
        threshold=args.stability_percentage / 100,
        drain_s=args.timeout_ms / 1000,
        restart_wait_s=args.restart_wait_s,
    )
    return LoadTestSettings(
        endpoints=tuple(endpoints),
        grpc_endpoints=tuple(grpc_endpoints),
        policies=tuple(policies_from_options(args.concurrency, args.request_rate, args.arrivals, args.seed)),
        models=tuple(models),
        batch_size=args.batch_size,
        protocol=args.protocol,
        encoding=args.encoding,
        windows=windows,
        timeout_s=args.timeout_ms / 1000,
        max_connections=args.max_connections,
        data=args.data,
        calibration_dir=args.calibration_root,
        metrics_endpoints=tuple(metrics or ()),
        repository=args.repository if args.url else (args.repository or DEFAULT_REPOSITORY),
        workers=args.workers,
        shared_memory=args.shared_memory,
        output_shm_size=args.output_shared_memory_size,
    )


@contextlib.contextmanager
def _local_repository(args: argparse.Namespace) -> Iterator[Path | S3Url | None]:
    """The repository a server reads; ``args.repository`` becomes the one this process reads (samples, uint8 scales):
    for an ``s3://`` repository a copy of what its server serves, removed afterwards."""
    served = args.repository
    if not isinstance(served, S3Url):
        yield served
        return
    from pipeline.triton.s3repository import readable

    with readable(served) as args.repository:
        yield served


@contextlib.contextmanager
def _servers(args: argparse.Namespace, served: Path | S3Url | None) -> Iterator[tuple[list[Endpoint], list[Endpoint], list[str], dict[str, str], list[Endpoint]]]:
    """The endpoints to load: the given URLs, or an embedded server started (and stopped) here."""
    if args.url:
        endpoints = [endpoint_from_url(u) for u in args.url]
        grpc = [endpoint_from_url(u) for u in args.grpc_url]
        if args.protocol == "grpc":
            require(len(grpc) == len(endpoints), "--protocol grpc with --url needs a --grpc-url for every --url",
                    "e.g. --url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001")
        metrics = [endpoint_from_url(u) for u in args.metrics_url] or [default_metrics_endpoint(e) for e in endpoints]
        require(len(metrics) == len(endpoints), "--metrics-url must be given once for every --url (or not at all)",
                "e.g. --url 127.0.0.1:8000 --metrics-url 127.0.0.1:8002")
        yield endpoints, grpc, list(args.model), {}, metrics
        return
    from pipeline.triton.server import TritonServer

    repository = served or DEFAULT_REPOSITORY
    _check_before_start(args, args.repository or DEFAULT_REPOSITORY)
    log.info("starting the embedded tritonserver on %s", repository)
    with TritonServer(repository, workdir=args.workdir) as server:
        models = list(args.model) or list(server.ready_models)
        missing = [m for m in models if m not in server.ready_models]
        require(not missing, f"model(s) {', '.join(missing)} are not served from {repository} "
                f"(served: {', '.join(server.ready_models)}; skipped: {server.skipped_models or 'none'})",
                "pass a served --model, or build the model first (python -m pipeline build)")
        yield ([endpoint_from_url(server.http_url)], [endpoint_from_url(server.grpc_url)], models, dict(server.skipped_models),
               [endpoint_from_url(server.metrics_url)])


def _check_before_start(args: argparse.Namespace, repository: Path) -> None:
    """Named models must be in the repository and have samples, before a server takes seconds to start."""
    if not args.model or not repository.is_dir():
        return  # the server's own start reports a missing or empty repository
    present = sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file())
    missing = [m for m in args.model if m not in present]
    require(not missing, f"model(s) {', '.join(missing)} are not in {repository} (it has: {', '.join(present) or 'no models'})",
            "pass --model with one of those names, or --repository with the one that holds the model")
    if args.data is None:
        for model in args.model:
            eval_data_path(model, args.calibration_root, repository)


def run(args: argparse.Namespace) -> int:
    """Run the load test, show the table, write the reports; see the exit status in --help."""
    from pipeline.core.console import console as make_console

    console = make_console()
    report_dir, page_folder = run_report_dirs(args.report_dir, args.workdir)
    if args.merge:
        from pipeline.loadtest.merge import merge_shards

        require_creatable(report_dir, "--report-dir")
        return _show(merge_shards(args.merge), args, report_dir, page_folder, console)
    # Options are checked before any server starts, so a typo costs no startup time.
    settings_from_args(args, [Endpoint("127.0.0.1", 1)], [Endpoint("127.0.0.1", 1)], [])
    scenario = scenario_settings(args)
    gates = scenario_gates(args)
    require(scenario is None or not args.shard, "--scenario runs LoadGen in one process, not as shards",
            "leave out --shard (--k8s-job runs the scenario in one pod)")
    if args.k8s_job or args.shard:
        require(bool(args.url), f"{'--k8s-job' if args.k8s_job else '--shard'} needs the address of the servers to load",
                "pass --url HOST:PORT (in Kubernetes: the Triton Service, e.g. --url triton-mig-1g-18gb:8000)")
        return _write_k8s_job(args, console) if args.k8s_job else _run_shard(args, console)
    require_creatable(report_dir, "--report-dir")
    with _local_repository(args) as served, _servers(args, served) as (endpoints, grpc, models, skipped, metrics):
        settings = settings_from_args(args, endpoints, grpc, models, metrics)
        if scenario is not None:
            try:
                return run_scenarios(settings, scenario, report_dir, console, gates, args.accuracy_target)
            finally:  # a run that was INVALID or failed its gates is on the page too
                page = args.refresh_page(args.workdir, page_folder) if args.refresh_page else None
                if page:
                    console.print(f"report: {page}")
        result = run_loadtest(settings)
        result.skipped_models = skipped
    return _show(result, args, report_dir, page_folder, console)


def _show(result: RunResult, args: argparse.Namespace, report_dir: Path, page_folder: Path, console: Any) -> int:
    """The tables, the reports, the exit status."""
    if not result.points:
        raise PipelineError("no load point was measured", "check the server and the --model names")
    from pipeline.core.tables import to_rich
    from pipeline.loadtest.report import metrics_table, steps_data, table, write_reports

    console.print(table(result, args.slo_p99_ms))
    steps = steps_data(result)
    if steps is not None:
        console.print(to_rich(steps))
    console.print(metrics_table(result))
    written = write_reports(result, report_dir, args.slo_p99_ms)
    console.print(f"reports: {', '.join(str(p) for p in written)}")
    page = args.refresh_page(args.workdir, page_folder) if args.refresh_page else None
    if page:
        console.print(f"report: {page}")
    return _verdict(result, args.slo_p99_ms, console)


# the options a shard pod repeats (everything that shapes the load and its measurement)
_SHARD_OPTIONS = (
    "url", "grpc_url", "model", "batch_size", "protocol", "encoding", "shared_memory", "output_shared_memory_size", "data", "calibration_root", "timeout_ms",
    "concurrency", "request_rate", "arrivals", "seed", "workers", "max_connections", "window_ms", "warmup_ms",
    "max_seconds", "stability_percentage", "restart_wait_s",
)  # fmt: skip


def _write_k8s_job(args: argparse.Namespace, console: Any) -> int:
    from pipeline.loadtest.k8s_job import iso_start, job_manifests, write_job
    from pipeline.loadtest.shards import parse_ready_margin, parse_start

    forwarded: list[str] = []
    for name in _SHARD_OPTIONS + (SCENARIO_OPTIONS if args.scenario else ()):
        value = getattr(args, name)
        for v in value if isinstance(value, list) else [value]:
            if v is not None:
                forwarded += [f"--{name.replace('_', '-')}", str(v)]
    if args.scenario:  # one pod: LoadGen is one process; its logs and the reports go to the results volume
        written = write_job(args.k8s_job, job_manifests(args.job_name, args.image, args.pods or 1, forwarded, None,
                                                        args.results_claim))
        console.print(f"wrote {', '.join(str(p) for p in written)}; after kubectl apply -f {args.k8s_job}, the LoadGen logs and "
                      f"mlperf.json are in /results/{args.job_name} where the claim is mounted")
        return 0
    margin = parse_ready_margin(args.start_at or "")
    start = None if margin is not None else parse_start(args.start_at or "+300")
    docs = job_manifests(args.job_name, args.image, args.pods or 2, forwarded, args.start_at if start is None else iso_start(start), args.results_claim)
    written = write_job(args.k8s_job, docs)
    console.print(f"wrote {', '.join(str(p) for p in written)}")
    when = (f"{margin:g} s after the last of them is ready" if start is None
            else f"at {_dt.datetime.fromtimestamp(start).astimezone():%Y-%m-%d %H:%M:%S %Z}: kubectl apply -f {args.k8s_job} before then")
    console.print(f"the {args.pods or 2} pods start the load {when}; afterwards, where the claim is mounted: "
                  f"python -m pipeline loadtest --merge /results/{args.job_name}")
    return 0


def _run_shard(args: argparse.Namespace, console: Any) -> int:
    from pipeline.loadtest.shards import ShardPlan, parse_ready_margin, parse_shard, parse_start, run_shard

    index, count = parse_shard(args.shard)
    require(args.start_at is not None, "--shard needs --start-at, the same for every shard", "e.g. --start-at 2026-12-01T21:00:00Z")
    require(args.shard_output is not None, "--shard needs --shard-output", "e.g. --shard-output /results/run1")
    with _local_repository(args) as served, _servers(args, served) as (endpoints, grpc, models, _, metrics):
        settings = settings_from_args(args, endpoints, grpc, models, metrics)
        margin = parse_ready_margin(args.start_at)
        plan = ShardPlan(index, count, 0.0, margin) if margin is not None else ShardPlan(index, count, parse_start(args.start_at))
        path = run_shard(settings, plan, args.shard_output)
    console.print(f"shard results: {path}")
    return 0


def _verdict(result: RunResult, slo_p99_ms: float | None, console: object) -> int:
    status = 0
    for model, reason in result.skipped_models.items():
        console.print(f"[yellow]skipped {model}: {reason}[/]")  # type: ignore[attr-defined]
    for failure in result.failures:
        console.print(f"[red]failed: {failure}[/]")  # type: ignore[attr-defined]
        status = EXIT_CHECK_FAILED
    errored = [p for p in result.points if p.aggregate.error_count]
    if errored:
        total = sum(p.aggregate.error_count for p in errored)
        kinds: dict[str, int] = {}
        for p in errored:
            for kind, n in p.aggregate.errors.items():
                kinds[kind] = kinds.get(kind, 0) + n
        console.print(f"[red]{total} failed requests in {len(errored)} point(s): "  # type: ignore[attr-defined]
                      f"{', '.join(f'{k} ×{v}' for k, v in sorted(kinds.items()))}[/]")
        status = EXIT_CHECK_FAILED
    for point in result.points:
        for window in point.disrupted:
            console.print(f"[yellow]{point.model} {point.label}: {window} — left out of the statistics[/]")  # type: ignore[attr-defined]
    hint = unstable_hint(result.points, result.settings.get("stability_threshold", 0.1), result.settings["window_s"], result.settings["max_s_per_point"])
    if hint:
        console.print(f"[yellow]{hint}[/]")  # type: ignore[attr-defined]
    cpu = [p.client_cpu_us_per_request for p in result.points if not math.isnan(p.client_cpu_us_per_request)]
    if cpu:
        console.print(f"client CPU per request: {min(cpu):.1f}-{max(cpu):.1f} µs ({result.generator['engine']})")  # type: ignore[attr-defined]
    if slo_p99_ms is not None:
        best = best_point(result.points, slo_p99_ms)
        if best is None:
            console.print(f"[red]SLO p99 ≤ {slo_p99_ms:g} ms: no point meets it[/]")  # type: ignore[attr-defined]
            status = EXIT_CHECK_FAILED
        else:
            console.print(  # type: ignore[attr-defined]
                f"[green]SLO p99 ≤ {slo_p99_ms:g} ms: best point {best.model} {best.label} — "
                f"{best.aggregate.infer_per_s:,.1f} infer/s at p99 {best.aggregate.latency.p99_ms:.3f} ms[/]"
            )
    return status
