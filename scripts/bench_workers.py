"""Does ``loadtest --workers N`` scale, and is its merge exact? Same server, same load, side by side.

Starts the embedded tritonserver with the trivial ``add`` model (x float32 [batch,4] → x + 1; see
bench_loadgen.py), then for each concurrency runs the load test with 1, 2 and 4 worker processes
in turn (the order rotating between repeats), each point measured the usual way (warm-up, windows
until the last 3 agree). Prints per run: requests/s, p50/p99, client CPU µs per request (all
processes), and whether the merged count equals Triton's own success count for the point
(the merge takes every raw sample, so percentiles are exact, not within a histogram's precision),
plus the ratios to the one-process run.

    python scripts/bench_workers.py                          # c = 16, 64; workers 1, 2, 4
    python scripts/bench_workers.py --pin --repeats 3        # server on CPU 0, clients on the others
    python scripts/bench_workers.py --server-cores 8 --instances 8   # a larger machine: a server that keeps up

On 2 cores the server is the bottleneck (one core each): the point is that N processes give the
same numbers as one. On a machine with free cores the throughput ratio shows the scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loadgen import MODEL, write_repository  # noqa: E402

from pipeline.loadtest.client import endpoint_from_url  # noqa: E402
from pipeline.loadtest.measure import WindowSettings  # noqa: E402
from pipeline.loadtest.policy import ClosedLoop  # noqa: E402
from pipeline.loadtest.runner import LoadTestSettings, run_loadtest  # noqa: E402
from pipeline.triton.server import TritonServer  # noqa: E402


def run(server: Any, data: Path, concurrency: int, workers: int, windows: WindowSettings, protocol: str) -> dict[str, Any]:
    settings = LoadTestSettings(
        endpoints=(endpoint_from_url(server.http_url),), grpc_endpoints=(endpoint_from_url(server.grpc_url),),
        policies=(ClosedLoop(concurrency),), models=(MODEL,), data=data, windows=windows, workers=workers, protocol=protocol,
    )  # fmt: skip
    (point,) = run_loadtest(settings).points
    agg = point.aggregate
    return {
        "workers": workers, "concurrency": concurrency, "rps": agg.throughput_rps, "p50_ms": agg.latency.p50_ms,
        "p99_ms": agg.latency.p99_ms, "cpu_us": point.client_cpu_us_per_request, "stable": point.stable,
        "count_equals_triton": agg.client_successes_total == agg.server_successes_total, "errors": agg.error_count,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="16,64", help="comma-separated (default: %(default)s)")
    parser.add_argument("--workers", default="1,2,4", help="comma-separated (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each; the median is shown (default: %(default)s)")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--pin", action="store_true", help="server on CPU 0, clients on the other CPUs")
    parser.add_argument("--server-cores", type=int, help="server on the first N CPUs, clients on the others")
    parser.add_argument("--instances", type=int, default=1, help="instances of the add model (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    cores = args.server_cores or (1 if args.pin else 0)
    if cores and not 1 <= cores < len(cpus):
        parser.error(f"--server-cores must leave the clients a CPU: 1..{len(cpus) - 1}")
    server_cpus, client_cpus = (cpus[:cores], cpus[cores:]) if cores else (None, None)
    windows = WindowSettings(window_s=1.0, warmup_s=1.0, max_s=10.0)
    levels = [int(c) for c in args.concurrency.split(",")]
    counts = [int(w) for w in args.workers.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        root = Path(tmp)
        data = root / "eval.npz"
        np.savez(data, x=np.random.default_rng(0).random((64, 4), dtype=np.float32))
        with TritonServer(write_repository(root, args.instances), log_path=root / "tritonserver.log", cpus=server_cpus) as server:
            if client_cpus:
                os.sched_setaffinity(0, client_cpus)  # the workers inherit it
            for c in levels:
                runs: dict[int, list[dict[str, Any]]] = {w: [] for w in counts}
                for r in range(args.repeats):
                    for w in counts[r % len(counts):] + counts[: r % len(counts)]:
                        runs[w].append(run(server, data, c, w, windows, args.protocol))
                        print(f"  c={c} workers={w}: {runs[w][-1]['rps']:.0f} req/s", flush=True)
                for w in counts:
                    median = sorted(runs[w], key=lambda x: x["rps"])[len(runs[w]) // 2]
                    rows.append({**median, "all_counts_equal": all(x["count_equals_triton"] for x in runs[w])})
    print(f"\n{'c':>4} {'workers':>7} {'req/s':>8} {'× 1 proc':>8} {'p50 ms':>7} {'p99 ms':>7} {'p99 × 1':>7} "
          f"{'CPU µs/req':>10} {'count = Triton':>14} {'stable':>6}")  # fmt: skip
    for row in rows:
        one = next(x for x in rows if x["concurrency"] == row["concurrency"] and x["workers"] == counts[0])
        print(f"{row['concurrency']:>4} {row['workers']:>7} {row['rps']:>8.0f} {row['rps'] / one['rps']:>8.2f} {row['p50_ms']:>7.3f} "
              f"{row['p99_ms']:>7.3f} {row['p99_ms'] / one['p99_ms']:>7.2f} {row['cpu_us']:>10.1f} "
              f"{'yes' if row['all_counts_equal'] else 'NO':>14} {'yes' if row['stable'] else 'no':>6}")  # fmt: skip
    pinned = f", server on {len(server_cpus)} CPU(s), clients on {len(client_cpus)}" if server_cpus and client_cpus else ""
    print(f"\n{args.protocol}, median of {args.repeats}, {len(cpus)} CPUs{pinned}, {args.instances} model instance(s)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r["all_counts_equal"] and not r["errors"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
