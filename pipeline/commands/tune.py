"""`python -m pipeline tune`: serving configs chosen by load tests, per model (and per MIG slice)."""

from __future__ import annotations

import argparse
import datetime as _dt
import logging
import os
import shlex
import time
from pathlib import Path
from typing import Any

from pipeline.core.errors import require, require_creatable
from pipeline.core.options import CALIBRATION_ROOT, DEFAULT_REPOSITORY
from pipeline.loadtest.measure import WindowSettings
from pipeline.loadtest.policy import ARRIVALS
from pipeline.reports.dirs import REPORT_DIR_HELP, PageRefresher, run_report_dirs
from pipeline.tune.policy import SEARCHES
from pipeline.tune.space import PREFERRED_RULES
from pipeline.tune.trial import TrialSettings
from pipeline.tune.tuner import ModelTune, SpaceOptions, TuneSettings

log = logging.getLogger(__name__)

EXIT_SLO_MISSED = 1
SCENARIO_START_QPS = 50.0  # tune --scenario server: the first target QPS without --request-rate


def _default_cores() -> int:
    # Like `serve` and `loadtest`: the whole machine. Fewer cores rehearse a slice (the generator gets the rest).
    return len(os.sched_getaffinity(0))


def _local_repository(text: str) -> Path:
    """``--repository``: tune reads and (with --apply) writes a local folder; any URL is refused in one line."""
    from pipeline.core.errors import PipelineError
    from pipeline.core.objectstore import local_only, repository_from_text

    try:
        return local_only(repository_from_text(text), "tune")
    except PipelineError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: argparse._SubParsersAction, refresh_page: PageRefresher | None = None) -> None:
    """Add the ``tune`` command; ``refresh_page`` updates the HTML page after it (None: no page)."""
    p = subparsers.add_parser(
        "tune",
        help="choose instance count, max batch and dynamic batching by load tests (highest infer/s under a p99 SLO)",
        description=(
            "Measure serving configurations of a model on a real tritonserver and keep the one with the highest "
            "throughput whose client p99 meets --slo-p99-ms. Each candidate is loaded with the repository API "
            "(a config override, explicit model control: no restart, model files untouched) and measured by the "
            "load tester while the load doubles until p99 breaks the SLO; its score is its best point under the "
            "SLO. Knobs: instance count, max_batch_size (never above what the model file or engine profile "
            "admits), preferred batch sizes, max queue delay. Every trial is cached: an interrupted or repeated "
            "tune re-measures nothing it has. On a server that exports GPU metrics, each trial also measures the "
            "model's GPU memory per instance (nv_gpu_memory_used_bytes, with the model unloaded before and loaded after), "
            "which `mig-plan --from-tune` checks slices against. Without --apply the repository is not touched."
        ),
        epilog=(
            "examples:\n"
            "  python -m pipeline tune --model digits_fp32 --slo-p99-ms 10 --max-trials 8\n"
            "  python -m pipeline tune --model digits_fp32 --model digits_int8 --slo-p99-ms 5   # + Pareto table\n"
            "  python -m pipeline tune --model digits_fp32 --slo-p99-ms 10 --search grid --instances 1,2 --max-batch 16,64\n"
            "  python -m pipeline tune --model digits_fp32 --slo-p99-ms 10 --apply              # publish as a new version\n"
            "  python -m pipeline tune --model digits_fp32 --slo-p99-ms 10 --cores 1 --profile cpu-1\n"
            "  python -m pipeline tune --model digits_fp32 --slo-p99-ms 10 --scenario server   # highest VALID MLPerf Server QPS\n"
            "  TRITON_ADMIN_KEY=... python -m pipeline tune --url 10.0.0.5:8000 --model digits_fp32 --slo-p99-ms 10 \\\n"
            "      --profile 2g.35gb                                                           # one MIG slice\n"
            "\nexit status: 0 a config meets the SLO; 1 no candidate meets it (the report names the closest);\n"
            "2 a usage or setup problem (nothing changed).\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_argument_group("what to tune")
    what.add_argument("--model", action="append", default=[], required=True, metavar="NAME",
                      help="Triton model to tune; repeat for precision variants of one model (adds the Pareto table)")
    what.add_argument("--slo-p99-ms", type=float, required=True, metavar="MS", help="client p99 latency objective (required)")
    target = p.add_argument_group("target")
    target.add_argument("--repository", type=_local_repository, default=DEFAULT_REPOSITORY, help="model repository (default: %(default)s)")
    target.add_argument("--cores", type=int, default=_default_cores(),
                        help="embedded server: pin it to this many CPUs (a slice rehearsal); the load generator runs on "
                             "the others (default: every CPU, %(default)s, shared with the load generator)")
    target.add_argument("--url", metavar="HOST:PORT",
                        help="tune on a running Triton in explicit model-control mode instead (HTTP address); the admin "
                             "key comes from $TRITON_ADMIN_KEY when its repository API is restricted")
    target.add_argument("--metrics-url", metavar="HOST:PORT",
                        help="with --url: the server's Prometheus metrics address, where GPU memory is read (default: the "
                             "HTTP port + 2, Triton's layout)")
    target.add_argument("--profile", metavar="NAME",
                        help="label this run with a MIG profile (e.g. 2g.35gb, whole-gpu for a GPU without MIG, or cpu-1/cpu-2 on CPU) for "
                             "`mig-plan --from-tune`; with --apply the best config goes to configs/NAME.pbtxt")
    space = p.add_argument_group("search space (comma-separated values; defaults from the model)")
    space.add_argument("--instances", metavar="N,N", help="instance counts (default: 1,2,4 and the published one)")
    space.add_argument("--max-batch", metavar="B,B", help="max_batch_size values (default: 8, 16, ... up to the published one)")
    space.add_argument("--preferred", metavar="RULE,RULE",
                       help=f"preferred batch sizes: {', '.join(PREFERRED_RULES)} or explicit sizes like 8+16 "
                            "(default: none,half+max and the published one)")
    space.add_argument("--queue-delay-us", metavar="US,US", help="max_queue_delay_microseconds (default: 0,100,1000)")
    search = p.add_argument_group("search")
    search.add_argument("--search", choices=SEARCHES, default="quick",
                        help="quick: coordinate hill climbing from the published config; grid: every point (default: %(default)s)")
    search.add_argument("--max-trials", type=int, default=20, help="trials per model at most, cached ones included (default: %(default)s)")
    search.add_argument("--max-minutes", type=float, default=30, help="time per model at most (default: %(default)g)")
    search.add_argument("--cache", type=Path, help="trial cache (default: <workdir>/tune/trials.jsonl)")
    search.add_argument("--fresh", action="store_true", help="ignore cached trials (measure everything again)")
    load = p.add_argument_group("load (raised until p99 breaks the SLO)")
    load.add_argument("--request-rate", type=float, metavar="R",
                      help="open loop: start at R requests/s and double (default: closed loop from concurrency 1)")
    load.add_argument("--arrivals", choices=ARRIVALS, default="constant", help="open-loop arrivals (default: %(default)s)")
    load.add_argument("--max-load", type=float, help="stop the ramp here (default: concurrency 256, or 64 × the start rate)")
    load.add_argument("--fixed-load", type=float,
                      help="latency of every candidate is also reported at this load (default: concurrency 4, or the start rate)")
    load.add_argument("--window-ms", type=float, default=500, help="measurement window (default: %(default)g)")
    load.add_argument("--warmup-ms", type=float, default=300, help="warm-up per load point (default: %(default)g)")
    load.add_argument("--max-seconds", type=float, default=8, help="bound per load point (default: %(default)g)")
    load.add_argument("--calibration-root", type=Path, default=CALIBRATION_ROOT, help="where <model>/eval.npz lives (default: %(default)s)")
    load.add_argument("--data", type=Path, metavar="NPZ", help="request samples (default: <calibration-root>/<model>/eval.npz)")
    mlperf = p.add_argument_group("MLPerf scenario (each load point a run of MLPerf's LoadGen instead)")
    mlperf.add_argument("--scenario", choices=["server"], help="server: each point is LoadGen's Server scenario at a target QPS "
                        "(Poisson arrivals, --slo-p99-ms as its latency bound, early stopping); a candidate's score is its "
                        f"highest VALID target QPS. The ramp starts at --request-rate (default: {SCENARIO_START_QPS:g}) and doubles "
                        "up to --max-load (default: 64 × the start) until INVALID, then bisects")
    mlperf.add_argument("--min-duration-s", type=float, default=5.0, metavar="SECONDS",
                        help="with --scenario: each LoadGen run's minimum duration (MLPerf's: 600) (default: %(default)g)")
    out = p.add_argument_group("output")
    out.add_argument("--report-dir", type=Path, help=REPORT_DIR_HELP.format(run="tune-<timestamp>"))
    out.add_argument("--workdir", type=Path, default=Path("build"),
                     help="build workdir with <name>/accuracy.json; server logs (<workdir>/triton) and the reports folder (default: %(default)s)")
    out.add_argument("--apply", action="store_true",
                     help="publish the best config as a new model version (atomic; the previous version stays), or "
                          "with --profile write configs/<profile>.pbtxt")
    p.set_defaults(handler=run, refresh_page=refresh_page)


def settings_from_args(args: argparse.Namespace) -> TuneSettings:
    """Check the options (before any server starts) and gather them."""
    require(args.slo_p99_ms > 0, f"--slo-p99-ms {args.slo_p99_ms:g} is not a latency", "e.g. --slo-p99-ms 10")
    require(args.max_trials >= 1, "--max-trials must be at least 1", "e.g. --max-trials 8")
    require(args.max_minutes > 0, "--max-minutes must be positive", "e.g. --max-minutes 10")
    require(args.window_ms >= 50 and args.warmup_ms >= 0, "--window-ms must be ≥ 50 and --warmup-ms ≥ 0", "e.g. --window-ms 500")
    require(args.max_seconds * 1000 >= args.warmup_ms + 3 * args.window_ms,
            f"--max-seconds {args.max_seconds:g} leaves no room for the warm-up and 3 windows", "raise --max-seconds")
    require(len(set(args.model)) == len(args.model), "a --model is given twice", "name each model once")
    require(args.metrics_url is None or bool(args.url), "--metrics-url is for a remote server (--url)",
            "drop --metrics-url: the embedded server's metrics address is known")
    require(args.min_duration_s > 0, "--min-duration-s must be positive", "e.g. --min-duration-s 5")
    open_loop = args.request_rate is not None or args.scenario is not None
    start = args.request_rate if args.request_rate is not None else (SCENARIO_START_QPS if args.scenario else 1)
    require(start > 0, "--request-rate must be positive", "e.g. --request-rate 100")
    max_load = args.max_load or (start * 64 if open_loop else 256)
    fixed = start if args.scenario else args.fixed_load or (start if open_loop else 4)  # a scenario ramp has no fixed-load point of its own
    require(max_load >= start and fixed > 0, f"--max-load {max_load:g} is below the start {start:g} of the ramp", "raise --max-load")
    if not open_loop:
        require(float(fixed).is_integer() and float(max_load).is_integer(), "with a concurrency ramp, --fixed-load and --max-load are concurrencies",
                "use whole numbers, e.g. --fixed-load 4")
    windows = WindowSettings(window_s=args.window_ms / 1000, warmup_s=args.warmup_ms / 1000, max_s=args.max_seconds)
    trial = TrialSettings(slo_p99_ms=args.slo_p99_ms, open_loop=open_loop, start=start, max_load=max_load,
                          fixed_load=fixed, arrivals="poisson" if args.scenario else args.arrivals, windows=windows,
                          scenario=args.scenario, min_duration_s=args.min_duration_s)
    if args.profile is not None:
        from pipeline.mig.configs import config_name

        config_name(args.profile)
    return TuneSettings(
        models=tuple(args.model), trial=trial, repository=args.repository, search=args.search, max_trials=args.max_trials,
        max_minutes=args.max_minutes, space=SpaceOptions(args.instances, args.max_batch, args.preferred, args.queue_delay_us),
        cache_path=args.cache or args.workdir / "tune" / "trials.jsonl", fresh=args.fresh, profile=args.profile, calibration_root=args.calibration_root, data=args.data,
    )


def run(args: argparse.Namespace) -> int:
    """Tune, show the table, write the reports, print the diff or apply; see the exit status in --help."""
    from pipeline.core.console import console as make_console
    from pipeline.core.progress import progress
    from pipeline.tune.cache import TrialCache
    from pipeline.tune.results import progress_line
    from pipeline.tune.targets import EmbeddedTarget, Target, remote_target
    from pipeline.tune.tuner import prepare, tune_model

    console = make_console()
    settings = settings_from_args(args)
    began = time.monotonic()
    report_dir, page_folder = run_report_dirs(args.report_dir, args.workdir, "tune-")
    require_creatable(report_dir, "--report-dir")
    remote = remote_target(args.url, args.metrics_url) if args.url else None
    jobs = [prepare(settings, remote, model) for model in settings.models]  # every bad input fails here, before any load
    if args.apply:
        from pipeline.tune.apply import check_can_apply

        for job in jobs:
            check_can_apply(job, settings.profile, settings.repository)
    cache = TrialCache(settings.cache_path, fresh=settings.fresh)
    target: Target = remote if remote is not None else EmbeddedTarget(settings.repository, args.cores, workdir=args.workdir)
    try:
        for job in jobs:
            with progress(f"tune {job.model}", settings.max_trials, unit="trials", summary=False) as bar:  # each trial prints its line
                def report(j: ModelTune, t: Any, n: int, bar: Any = bar) -> None:
                    bar.advance()
                    console.print(progress_line(j, t, n, settings.max_trials), highlight=False)

                tune_model(settings, target, job, cache, report)
    finally:
        target.close()
    return _finish(console, args, settings, jobs, target, (report_dir, page_folder), time.monotonic() - began)


def _finish(console: Any, args: argparse.Namespace, settings: TuneSettings, jobs: list[ModelTune], target: Any,
            report_dirs: tuple[Path, Path], seconds: float) -> int:
    from pipeline.tune.apply import apply_best, config_diff
    from pipeline.tune.results import pareto, pareto_table, table, write_reports

    report_dir, page_folder = report_dirs
    console.print(table(jobs, settings.trial.slo_p99_ms))
    meta = {
        "slo_p99_ms": settings.trial.slo_p99_ms,
        "profile": settings.profile,
        "target": target.identity,
        "search": settings.search,
        "load_policy": settings.trial.to_dict(),
        "max_trials": settings.max_trials,
        "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "measured_trials": sum(not t.cached for j in jobs for t in j.trials),
        "cached_trials": sum(t.cached for j in jobs for t in j.trials),
        "command": "python -m pipeline " + shlex.join(getattr(args, "argv", [])),
    }
    if len(jobs) > 1:
        console.print(pareto_table(pareto(jobs, args.workdir), settings.trial.slo_p99_ms))
    written = write_reports(jobs, meta, report_dir, args.workdir)
    console.print(f"reports: {', '.join(str(p) for p in written)}", highlight=False)
    page = args.refresh_page(args.workdir, page_folder) if args.refresh_page else None
    if page:
        console.print(f"report: {page}", highlight=False)
    status = 0
    for job in jobs:
        best, base = job.best, job.baseline
        if not best.meets_slo:
            d = best.to_dict()
            what = "is VALID in MLPerf's Server scenario at" if settings.trial.scenario else "meets"
            console.print(f"[red]{job.model}: no candidate {what} p99 ≤ {settings.trial.slo_p99_ms:g} ms; closest: "
                          f"{best.candidate.label} with p99 {d['p99_ms']} ms at {_load(d)}[/]", highlight=False)
            status = EXIT_SLO_MISSED
            continue
        gain = best.score / base.score if base.meets_slo and base.score > 0 else float("inf")
        what = "VALID MLPerf Server target QPS" if settings.trial.scenario else "infer/s under the SLO"
        console.print(f"[green]{job.model}: best {best.candidate.label} — {best.score:,.0f} {what} "
                      f"({'×%.2f the published config' % gain if gain != float('inf') else 'the published config meets no load'})[/]",
                      highlight=False)
        diff = config_diff(job, settings.profile)
        if not diff:
            console.print(f"{job.model}: the published config is the best; nothing to change", highlight=False)
            continue
        if not args.apply:
            console.print(diff, highlight=False, markup=False, end="")
            console.print(f"{job.model}: repository unchanged (pass --apply to publish this config)", highlight=False)
            continue
        summary = {"slo_p99_ms": settings.trial.slo_p99_ms, "best": best.to_dict(), "baseline": base.to_dict(), "report": str(report_dir)}
        path = apply_best(job, settings.repository, settings.profile, summary, meta["command"])
        console.print(f"[green]{job.model}: applied → {path}[/]", highlight=False)
    console.print(f"tune took {seconds:.1f} s ({meta['measured_trials']} trials measured, {meta['cached_trials']} from the cache)",
                  highlight=False)
    return status


def _load(d: dict[str, Any]) -> str:
    if not d["load"]:
        return "no load"
    kind, value = next(iter(d["load"].items()))
    return f"{kind} {value:g}"

