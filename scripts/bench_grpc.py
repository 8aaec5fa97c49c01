"""Is our gRPC load as fast as perf_analyzer's? Same server, same model, back to back, pinned.

Starts the embedded tritonserver with the trivial ``add`` model (see bench_loadgen.py) on the
first CPU, then for each concurrency runs, on the second CPU, our gRPC engine (closed loop, the
pre-serialized ModelInferRequest of ``loadtest --protocol grpc``) for ``--seconds`` and
``perf_analyzer -i grpc`` (2.51, the release of the embedded server; from the
``tritonclient[all]==2.51.0`` wheel) at the same concurrency, alternating which goes first.
Throughput and p99 come from each tool's own measurement; client CPU per request is each one's
CPU time (ours: this process; perf_analyzer: its rusage) over the requests Triton counted while it
ran, so both are charged the same way. Target: ours/perf_analyzer ≥ 0.95 in throughput at c = 16,
and client CPU per request no higher than perf_analyzer's.

    python scripts/bench_grpc.py --perf-analyzer /tmp/pa-venv/bin/perf_analyzer
    python scripts/bench_grpc.py --perf-analyzer ... --concurrency 1,4,16 --repeats 3 --engine grpcio
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loadgen import MODEL, write_repository  # noqa: E402

from pipeline.loadtest.client import Endpoint, endpoint_from_url  # noqa: E402
from pipeline.loadtest.grpc_load import grpc_request_bytes  # noqa: E402
from pipeline.loadtest.payload import ModelIO, TensorInfo  # noqa: E402
from pipeline.loadtest.policy import ClosedLoop  # noqa: E402
from pipeline.loadtest.server_stats import fetch_counters  # noqa: E402
from pipeline.triton.server import TritonServer  # noqa: E402

IO = ModelIO(MODEL, (TensorInfo("x", "FP32", (4,)),), (TensorInfo("y", "FP32", (4,)),), 8)


def _engine(kind: str, endpoint: Endpoint, concurrency: int) -> Any:
    body = grpc_request_bytes(IO, {"x": np.array([[0.5, 1.5, 2.5, 3.5]], dtype=np.float32)})
    if kind == "grpcio":
        from pipeline.loadtest.grpc_load import GrpcEngine

        return GrpcEngine([(endpoint, [body])], ClosedLoop(concurrency), timeout_s=10.0)
    from pipeline.loadtest.h2_load import H2GrpcEngine

    return H2GrpcEngine([(endpoint, [body])], ClosedLoop(concurrency), timeout_s=10.0)


def run_ours(kind: str, http: Endpoint, grpc: Endpoint, concurrency: int, seconds: float) -> dict[str, float]:
    engine = _engine(kind, grpc, concurrency)
    before = fetch_counters(http, MODEL).success_count
    cpu0, t0 = time.process_time(), time.perf_counter_ns()
    engine.start()
    engine.run_until(t0 + int(seconds * 1e9))
    elapsed = (time.perf_counter_ns() - t0) / 1e9
    engine.finish(2.0)
    cpu = time.process_time() - cpu0
    served = fetch_counters(http, MODEL).success_count - before
    lat = np.frombuffer(engine.recorders[0].latency_ns, dtype=np.int64)
    return {"rps": lat.size / elapsed, "p99_ms": float(np.percentile(lat, 99)) / 1e6 if lat.size else float("nan"),
            "cpu_us": cpu / served * 1e6 if served else float("nan"), "errors": engine.recorders[0].error_count}  # fmt: skip


def run_perf_analyzer(binary: Path, http: Endpoint, grpc: Endpoint, concurrency: int, seconds: float, cpus: list[int] | None, tmp: Path) -> dict[str, float]:
    """perf_analyzer at one concurrency; on a busy machine it may find no stable windows: then again with windows twice as long."""
    for attempt in range(3):
        try:
            return _perf_analyzer_once(binary, http, grpc, concurrency, seconds * 2**attempt, cpus, tmp)
        except RuntimeError as exc:
            print(f"  perf_analyzer c={concurrency}: {exc}; again with {seconds * 2 ** (attempt + 1):g} s windows", flush=True)
    raise SystemExit(f"perf_analyzer found no stable measurement at c={concurrency}")


def _perf_analyzer_once(binary: Path, http: Endpoint, grpc: Endpoint, concurrency: int, seconds: float, cpus: list[int] | None, tmp: Path) -> dict[str, float]:
    report = tmp / f"pa-{concurrency}.csv"
    cmd = [str(binary), "-m", MODEL, "-i", "grpc", "-u", grpc.address, "--concurrency-range", f"{concurrency}:{concurrency}",
           "-p", str(int(seconds * 1000 / 3)), "-s", "50", "-r", "10", "--percentile", "99", "-f", str(report)]  # fmt: skip
    if cpus:
        cmd = ["taskset", "-c", ",".join(map(str, cpus)), *cmd]
    lib = Path(binary).resolve().parents[1] / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / "nvidia" / "cuda_runtime" / "lib"
    env = {**os.environ, "LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    before = fetch_counters(http, MODEL).success_count
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        if "stable measurement" in done.stdout + done.stderr:
            raise RuntimeError("no stable measurement")
        raise SystemExit(f"perf_analyzer failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    served = fetch_counters(http, MODEL).success_count - before
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    with open(report) as fh:
        row = next(csv.DictReader(fh))
    return {"rps": float(row["Inferences/Second"]), "p99_ms": float(row["p99 latency"]) / 1e3, "cpu_us": cpu / served * 1e6, "errors": 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--perf-analyzer", type=Path, required=True, help="the perf_analyzer 2.51 binary")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=6.0, help="our run; perf_analyzer's window is a third of it (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=2, help="pairs per concurrency; the median of each is shown (default: %(default)s)")
    parser.add_argument("--engine", choices=("h2", "grpcio"), default="h2", help="ours: the HTTP/2 engine (loadtest's) or grpcio futures")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the server to CPU 0 and the clients to the others")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus, client_cpus = (None, None) if args.no_pin or len(cpus) < 2 else (cpus[:1], cpus[1:])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-grpc-") as tmp:
        root = Path(tmp)
        with TritonServer(write_repository(root), log_path=root / "tritonserver.log", cpus=server_cpus) as server:
            http, grpc = endpoint_from_url(server.http_url), endpoint_from_url(server.grpc_url)
            if client_cpus:
                os.sched_setaffinity(0, client_cpus)
            run_ours(args.engine, http, grpc, 4, 1.0)  # warm the server and this process
            for c in (int(v) for v in args.concurrency.split(",")):
                ours, pa = [], []
                for r in range(args.repeats):
                    for who in (("ours", "pa") if r % 2 == 0 else ("pa", "ours")):
                        if who == "ours":
                            ours.append(run_ours(args.engine, http, grpc, c, args.seconds))
                        else:
                            pa.append(run_perf_analyzer(args.perf_analyzer, http, grpc, c, args.seconds, client_cpus, root))
                o = {k: float(np.median([x[k] for x in ours])) for k in ours[0]}
                p = {k: float(np.median([x[k] for x in pa])) for k in pa[0]}
                rows.append({"concurrency": c, "ours": o, "perf_analyzer": p, "ratio": o["rps"] / p["rps"]})
                print(f"  c={c}: ours {o['rps']:.0f}/s, perf_analyzer {p['rps']:.0f}/s", flush=True)
    print(f"\n{'c':>4} {'ours req/s':>10} {'PA req/s':>9} {'ours/PA':>8} {'p99 ours':>9} {'p99 PA':>7} {'CPU µs/req ours':>16} {'PA':>6} {'errors':>6}")
    for row in rows:
        o, p = row["ours"], row["perf_analyzer"]
        print(f"{row['concurrency']:>4} {o['rps']:>10.0f} {p['rps']:>9.0f} {row['ratio']:>8.2f} {o['p99_ms']:>9.3f} {p['p99_ms']:>7.3f} "
              f"{o['cpu_us']:>16.1f} {p['cpu_us']:>6.1f} {int(o['errors']):>6}")  # fmt: skip
    c16 = [r for r in rows if r["concurrency"] == 16]
    met = all(r["ratio"] >= 0.95 and r["ours"]["cpu_us"] <= r["perf_analyzer"]["cpu_us"] for r in c16)
    print(f"\nengine {args.engine}; target ours/perf_analyzer ≥ 0.95 at c=16 with no more client CPU per request: "
          f"{'met' if met else 'NOT met'} (median of {args.repeats}, {len(cpus)} CPUs{', pinned' if client_cpus else ''})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
