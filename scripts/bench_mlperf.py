"""LoadGen's Server scenario beside the load test's own open-loop generator: same server, same Poisson rate.

Starts the embedded tritonserver with the trivial ``add`` model (bench_loadgen.py), then for each rate runs, one after
the other (the order alternating between repeats):

- ``loadgen``: ``loadtest --scenario server`` at that target QPS (MLPerf's LoadGen issuing through the epoll HTTP
  engine, pipeline/loadtest/loadgen/);
- ``open-loop``: the load test's own Poisson open loop at that rate (``--request-rate R --arrivals poisson``), one
  point of warm-up and windows, measured the usual way.

Both report p50/p99 from every request of the run and the achieved QPS; the ratios loadgen / open-loop should sit
within the two generators' run-to-run spread (the repeats show it). Then the client's own cost: CPU time of this
process per query, LoadGen + the engine against Triton, and LoadGen + :class:`AnswersAtOnce` (no server: LoadGen
and the bridge alone), beside the open loop's client CPU per request.

With ``--find-max``, it also climbs a ladder of rates (× 1.25 from the first) for each generator: the highest rate at
which LoadGen's Server run is VALID at ``--bound-ms``, and the highest at which the open loop's p99 stays within
it. Both are Poisson: the ratio (MLPerf's acceptance: at least 0.9) is what LoadGen and its bridge cost.

    python scripts/bench_mlperf.py                         # rates 100, 300, 600; 10 s each; 2 repeats
    python scripts/bench_mlperf.py --rates 200 --seconds 30 --repeats 3 --json out.json
    python scripts/bench_mlperf.py --rates 400 --find-max --bound-ms 10
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loadgen import MODEL, write_repository  # noqa: E402

from pipeline.loadtest.client import endpoint_from_url  # noqa: E402
from pipeline.loadtest.loadgen.http_sut import TritonSut  # noqa: E402
from pipeline.loadtest.loadgen.run import AnswersAtOnce, run_scenario  # noqa: E402
from pipeline.loadtest.loadgen.settings import ScenarioSettings  # noqa: E402
from pipeline.loadtest.measure import WindowSettings  # noqa: E402
from pipeline.loadtest.policy import ClosedLoop, OpenLoop  # noqa: E402
from pipeline.loadtest.runner import LoadTestSettings, model_spec, run_loadtest  # noqa: E402
from pipeline.triton.server import TritonServer  # noqa: E402


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_loadgen(endpoint: Any, payloads: list[bytes], rate: float, seconds: float, bound_ms: float, out: Path, sut: Any = None) -> dict[str, Any]:
    settings = ScenarioSettings(scenario="server", target_qps=rate, latency_bound_ms=bound_ms, min_duration_s=seconds, min_query_count=1)
    own = sut is None
    sut = sut or TritonSut(MODEL, endpoint, payloads, "server")
    if own:
        sut.start()
    cpu = _cpu_s()
    try:
        verdict = run_scenario(settings, sut, len(payloads), out)
    finally:
        cpu = _cpu_s() - cpu
        if own:
            sut.stop()
    queries = verdict.query_count or 1
    p = verdict.percentiles_ns
    return {"generator": "loadgen" if own else "loadgen-answers-at-once", "rate": rate, "qps": verdict.value, "p50_ms": p["50.00"] / 1e6,
            "p99_ms": p["99.00"] / 1e6, "result": verdict.result, "cpu_us_per_query": cpu / queries * 1e6}


def run_open_loop(endpoint: Any, data: Path, rate: float, seconds: float) -> dict[str, Any]:
    windows = WindowSettings(window_s=seconds / 4, warmup_s=1.0, max_s=seconds + 1.0, threshold=1.0)  # the whole run, as LoadGen's
    settings = LoadTestSettings(endpoints=(endpoint,), policies=(OpenLoop(rate, "poisson", 0),), models=(MODEL,), data=data, windows=windows)
    (point,) = run_loadtest(settings).points
    agg = point.aggregate
    return {"generator": "open-loop", "rate": rate, "qps": agg.throughput_rps, "p50_ms": agg.latency.p50_ms, "p99_ms": agg.latency.p99_ms,
            "result": "stable" if point.stable else "unstable", "cpu_us_per_query": point.client_cpu_us_per_request}


def find_max(endpoint: Any, payloads: list[bytes], root: Path, start: float, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each generator's highest passing rate on a ladder × 1.25 from ``start`` (two failures in a row end a climb)."""
    rows, best = [], {}
    for generator in ("loadgen", "open-loop"):
        rate, misses, best[generator] = start, 0, 0.0
        while misses < 2:
            if generator == "loadgen":
                row = run_loadgen(endpoint, payloads, rate, args.seconds, args.bound_ms, root / "logs")
                ok = row["result"] == "VALID"
            else:
                row = run_open_loop(endpoint, root / "eval.npz", rate, args.seconds)
                ok = row["p99_ms"] <= args.bound_ms and row["qps"] >= 0.95 * rate
            rows.append(row | {"generator": f"{generator} (ladder)", "passed": ok})
            print(json.dumps(rows[-1]), flush=True)
            best[generator] = max(best[generator], rate) if ok else best[generator]
            misses = 0 if ok else misses + 1
            rate *= 1.25
    ratio = best["loadgen"] / best["open-loop"] if best["open-loop"] else float("nan")
    print(f"\nhighest rate within {args.bound_ms:g} ms: LoadGen Server VALID at {best['loadgen']:.0f} QPS, open loop p99 within it at "
          f"{best['open-loop']:.0f} QPS: ratio {ratio:.2f}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="100,300,600", help="Poisson rates, queries/s (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=10, help="each run's duration (default: %(default)g)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each generator per rate (default: %(default)s)")
    parser.add_argument("--bound-ms", type=float, default=50, help="LoadGen's latency bound (default: %(default)g)")
    parser.add_argument("--json", type=Path, help="write every run here")
    parser.add_argument("--find-max", action="store_true", help="climb rates × 1.25 from the first until each generator fails the bound")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-mlperf-") as tmp:
        root = Path(tmp)
        repo = write_repository(root)
        np.savez(root / "eval.npz", x=np.random.default_rng(0).random((64, 4), dtype=np.float32))
        with TritonServer(repo, workdir=root / "w") as server:
            endpoint = endpoint_from_url(server.http_url)
            spec = LoadTestSettings(endpoints=(endpoint,), policies=(ClosedLoop(1),), models=(MODEL,), data=root / "eval.npz", distinct_requests=64)
            ((_, payloads),) = model_spec(spec, MODEL).targets
            for rate in rates:
                for repeat in range(args.repeats):
                    order = ("loadgen", "open-loop") if repeat % 2 == 0 else ("open-loop", "loadgen")
                    for generator in order:
                        started = time.perf_counter()
                        if generator == "loadgen":
                            row = run_loadgen(endpoint, payloads, rate, args.seconds, args.bound_ms, root / "logs")
                        else:
                            row = run_open_loop(endpoint, root / "eval.npz", rate, args.seconds)
                        rows.append(row | {"repeat": repeat, "wall_s": time.perf_counter() - started})
                        print(json.dumps(rows[-1]), flush=True)
                rows.append(run_loadgen(endpoint, payloads, rate, args.seconds, args.bound_ms, root / "logs", sut=AnswersAtOnce()) | {"repeat": 0})
                print(json.dumps(rows[-1]), flush=True)
            if args.find_max:
                rows += find_max(endpoint, payloads, root, rates[0], args)  # named "(ladder)": not in the side-by-side means
    print(f"\n{'rate':>6} {'generator':<24} {'QPS':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU µs/q':>9}  result")
    for r in rows:
        print(f"{r['rate']:>6g} {r['generator']:<24} {r['qps']:>8.1f} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['cpu_us_per_query']:>9.1f}  {r['result']}")
    print(f"\n{'rate':>6} {'p50 loadgen/open':>17} {'p99 loadgen/open':>17} {'QPS loadgen/open':>17}")
    for rate in rates:
        mean = {g: {k: float(np.mean([r[k] for r in rows if r["rate"] == rate and r["generator"] == g])) for k in ("p50_ms", "p99_ms", "qps")}
                for g in ("loadgen", "open-loop")}
        print(f"{rate:>6g} {mean['loadgen']['p50_ms'] / mean['open-loop']['p50_ms']:>17.2f} "
              f"{mean['loadgen']['p99_ms'] / mean['open-loop']['p99_ms']:>17.2f} {mean['loadgen']['qps'] / mean['open-loop']['qps']:>17.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
