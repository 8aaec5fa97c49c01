"""Throughput of the served FP32 digits model vs the same file in process, side by side in one run.

In process: ``session_from_onnx(model.onnx, threads=T)`` running batch-32 inferences back to back for
``--seconds``, this process pinned to the same T cores the server gets. Served: the embedded
tritonserver on a copy of the repository holding only ``digits_fp32``, pinned to T cores
(``TritonServer(cpus=...)``), its config's ``intra_op_thread_count`` set to T and
``inter_op_thread_count`` to 1 (the parameters our onnxruntime backend reads, as the C++ one does),
driven by the product's load generator (``pipeline.loadtest``: a closed loop of C requests in flight,
its epoll HTTP engine pinned to the *other* cores when there are any, like a remote client), each
request a batch of 32 real samples, once with the tensors in the HTTP body (binary extension) and once
in system shared memory registered with Triton (``--shared-memory system``). Every row runs in every
round, in turn, on one server; the ratio is taken within a round, and the table shows the medians.

The served path adds HTTP framing, Triton's scheduler (dynamic batching: concurrent batch-32 requests
may be merged up to the config's preferred 64), the Python backend's shared-memory hop into a stub
process and the backend's Python. On a model this small (~0.1 ms of compute per sample) that overhead
is a large part of the request time; Triton's own per-request breakdown (queue, compute input / infer /
output, average batch) is printed beside each served row.

    .venv/bin/python scripts/bench_served.py                   # builds build/bench_served/ if needed
    .venv/bin/python scripts/bench_served.py --repository model_repository --threads 1 --seconds 10

Prints a table and writes ``reports/bench_served.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from google.protobuf import text_format

from pipeline.backend.onnxrt import session_from_onnx
from pipeline.triton.config import parse_config
from pipeline.triton.server import TritonServer

MODEL = "digits_fp32"
BATCH = 32


def ensure_repository(repository: Path, workdir: Path) -> Path:
    """Reuse ``repository`` if it serves digits_fp32, else build the default model into it."""
    if (repository / MODEL / "config.pbtxt").is_file():
        return repository
    print(f"building the default model into {repository} (workdir {workdir}) ...", flush=True)
    subprocess.run(
        [sys.executable, "-m", "pipeline", "build", "--workdir", str(workdir), "--repository", str(repository)],
        cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    return repository


def bench_repository(repository: Path, dst: Path, threads: int, max_batch: int | None = None, instances: int = 1) -> tuple[Path, int]:
    """A copy of the repository with only MODEL, its ORT thread counts set (and, with ``max_batch``, its
    max batch and one preferred batch size of that many rows); returns it and the served version."""
    shutil.copytree(repository / MODEL, dst / MODEL, symlinks=True)
    config_path = dst / MODEL / "config.pbtxt"
    cfg = parse_config(config_path.read_text())
    if max_batch is not None:
        # What tune chooses among: one execution may merge every request in flight (c × 32 rows), so the
        # per-execution cost of the Python backend's stub round trip is paid once per merged batch.
        cfg.max_batch_size = max_batch
        del cfg.dynamic_batching.preferred_batch_size[:]
        cfg.dynamic_batching.preferred_batch_size.append(max_batch)
    cfg.instance_group[0].count = instances
    cfg.parameters["intra_op_thread_count"].string_value = str(threads)
    cfg.parameters["inter_op_thread_count"].string_value = "1"
    config_path.write_text(text_format.MessageToString(cfg))
    version = max(int(p.name) for p in (dst / MODEL).iterdir() if p.is_dir() and p.name.isdigit())
    return dst, version


def _threads(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4, after the parenthesised name
                found.append(int(entry))
    return found


def pin_layout(server_pid: int, front_end: str, ort_cpus: list[int], other_cpus: list[int]) -> list[int]:
    """Pin every thread of the backend's stub processes (the backend's Python and ONNX Runtime) to ``ort_cpus``,
    and every thread of tritonserver itself (HTTP, scheduler, the hand-off to the stubs) to ``ort_cpus`` too
    (``front_end="same"``) or to ``other_cpus`` (``"others"``, beside the client). Returns the stubs' pids.
    Affinity is per thread on Linux, so each task is pinned."""
    stubs = [c for c in _children(server_pid) if b"triton_python_backend_stub" in Path(f"/proc/{c}/cmdline").read_bytes()]
    if not stubs:
        raise SystemExit("no triton_python_backend_stub child found under the server")
    for tid in _threads(server_pid):
        os.sched_setaffinity(tid, ort_cpus if front_end == "same" else other_cpus)
    for stub in stubs:
        for tid in _threads(stub):
            os.sched_setaffinity(tid, ort_cpus)
    return stubs


def summary(mode: str, threads: int, concurrency: int, latencies: list[float], seconds: float) -> dict:
    ms = np.array(latencies) * 1000.0
    return {
        "mode": mode,
        "threads": threads,
        "concurrency": concurrency,
        "requests": len(latencies),
        "seconds": round(seconds, 3),
        "samples_per_s": round(len(latencies) * BATCH / seconds, 1),
        "requests_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
    }


def run_in_process(model_file: Path, images: np.ndarray, threads: int, cpus: list[int], seconds: float, warmup: float) -> dict:
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)  # the same cores the server gets
    try:
        session = session_from_onnx(model_file, threads=threads)
        feed = {"image": images}
        end = time.perf_counter() + warmup
        while time.perf_counter() < end:
            session.run(["probs"], feed)
        latencies = []
        started = time.perf_counter()
        end = started + seconds
        while True:
            t0 = time.perf_counter()
            session.run(["probs"], feed)
            t1 = time.perf_counter()
            latencies.append(t1 - t0)
            if t1 >= end:
                break
        return summary("in-process ORT", threads, 1, latencies, time.perf_counter() - started)
    finally:
        os.sched_setaffinity(0, allowed)


def ort_us_per_run(model_file: Path, images: np.ndarray, rows: int, threads: int, cpus: list[int], runs: int = 500) -> float:
    """Mean µs of one in-process ORT run at ``rows`` rows (the served executions' average batch), pinned like the server."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        session = session_from_onnx(model_file, threads=threads)
        feed = {"image": np.ascontiguousarray(np.resize(images, (rows, *images.shape[1:])))}
        for _ in range(50):
            session.run(["probs"], feed)
        started = time.perf_counter()
        for _ in range(runs):
            session.run(["probs"], feed)
        return (time.perf_counter() - started) / runs * 1e6
    finally:
        os.sched_setaffinity(0, allowed)


def run_served(url: str, data: Path, threads: int, concurrency: int, seconds: float, warmup: float, transport: str) -> dict:
    """``concurrency`` requests of batch BATCH in flight through the product's load generator (its epoll
    HTTP engine: tens of µs of client CPU per request, where tritonclient's threads spent hundreds),
    tensors in the body (``binary``) or in system shared memory (``system``); infer/s over the last
    three windows, with Triton's own per-request breakdown over the same windows."""
    from pipeline.loadtest.client import endpoint_from_url
    from pipeline.loadtest.measure import WindowSettings
    from pipeline.loadtest.policy import ClosedLoop
    from pipeline.loadtest.runner import LoadTestSettings, run_loadtest

    window = max(seconds / 3, 0.5)
    settings = LoadTestSettings(
        endpoints=(endpoint_from_url(url),), policies=(ClosedLoop(concurrency),), models=(MODEL,), batch_size=BATCH,
        windows=WindowSettings(window_s=window, warmup_s=warmup, max_s=warmup + 3 * window + 0.01, threshold=0.99),
        data=data, shared_memory="system" if transport == "system" else "none",
    )
    point = run_loadtest(settings).points[0]
    agg = point.aggregate
    if agg.error_count:
        raise RuntimeError(f"{transport}: {agg.error_count} failed requests: {agg.errors}")
    server = agg.server or {}
    return {
        "mode": f"served ({transport})",
        "threads": threads,
        "concurrency": concurrency,
        "requests": agg.requests,
        "seconds": round(agg.seconds, 3),
        "samples_per_s": round(agg.infer_per_s, 1),
        "requests_per_s": round(agg.throughput_rps, 1),
        "p50_ms": round(agg.latency.p50_ms, 3),
        "p99_ms": round(agg.latency.p99_ms, 3),
        "client_cpu_us_per_request": round(point.client_cpu_us_per_request, 1),
        "triton_us_per_request": {k: round(float(server[k]), 1) for k in ("request_us", "queue_us", "compute_input_us", "compute_infer_us", "compute_output_us") if k in server},
        "avg_batch_size": round(float(server.get("avg_batch_size", float("nan"))), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench_served" / "model_repository",
                        help="repository with digits_fp32 (built there if missing; default: %(default)s)")
    parser.add_argument("--workdir", type=Path, default=ROOT / "build" / "bench_served" / "build", help="build workdir if a build is needed")
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads = cores pinned, both modes (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4], help="requests in flight (default: 4)")
    parser.add_argument("--transports", nargs="+", choices=("binary", "system"), default=["binary", "system"],
                        help="served rows: HTTP binary body, or inputs and outputs in system shared memory (default: both)")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="serve with this max batch and preferred batch size (default: the published config's)")
    parser.add_argument("--front-end", nargs="+", choices=("same", "others"), default=["same", "others"],
                        help="served rows per layout: same: tritonserver and its backend stubs on the T cores ONNX Runtime gets "
                             "in process (the whole serving path on them); others: only the stubs (backend Python and ONNX "
                             "Runtime) there, tritonserver's HTTP front end and scheduler on the other cores, beside the client "
                             "(default: both)")
    parser.add_argument("--instances", type=int, default=1,
                        help="model instances (stub processes), all on the same T cores; one instance's stub round trip "
                             "overlaps another's ONNX Runtime run (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all rows in turn; medians reported (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per row (default: %(default)s)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each row (default: %(default)s)")
    parser.add_argument("--report", type=Path, default=ROOT / "reports" / "bench_served.json")
    args = parser.parse_args()

    allowed = sorted(os.sched_getaffinity(0))
    if not 1 <= args.threads <= len(allowed):
        parser.error(f"--threads must be 1..{len(allowed)} (the cores this process may use)")
    server_cpus = allowed[: args.threads]
    client_cpus = [c for c in allowed if c not in server_cpus] or allowed

    repository = ensure_repository(args.repository.resolve(), args.workdir.resolve())
    data = ROOT / "calibration" / "digits" / "eval.npz"
    with np.load(data, allow_pickle=False) as npz:
        images = np.ascontiguousarray(npz["image"][:BATCH].astype(np.float32))

    rounds: list[list[dict]] = []
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-served-") as tmp:
        bench_repo, version = bench_repository(repository, Path(tmp) / "repo", args.threads, args.max_batch, args.instances)
        model_file = bench_repo / MODEL / str(version) / "model.onnx"
        with TritonServer(bench_repo, cpus=server_cpus, log_path=Path(tmp) / "tritonserver.log") as server:
            if "others" in args.front_end and client_cpus == server_cpus:
                parser.error("--front-end others needs more cores than --threads")
            for k in range(args.rounds):
                rows = [run_in_process(model_file, images, args.threads, server_cpus, args.seconds, args.warmup)]
                os.sched_setaffinity(0, client_cpus)  # clients off the server's cores when there are others
                try:
                    for front_end in args.front_end:
                        pin_layout(server.pid, front_end, server_cpus, client_cpus)
                        for concurrency in args.concurrency:
                            for transport in args.transports:
                                row = run_served(server.http_url, data, args.threads, concurrency, args.seconds, args.warmup, transport)
                                row["front_end"] = front_end
                                row["mode"] += "" if front_end == "same" else " FE apart"
                                rows.append(row)
                finally:
                    os.sched_setaffinity(0, allowed)
                for row in rows:
                    row["ratio_vs_in_process"] = round(row["samples_per_s"] / rows[0]["samples_per_s"], 3)
                print(f"round {k + 1}: " + ", ".join(f"{r['mode']} c={r['concurrency']} {r['samples_per_s']:.0f}/s ({r['ratio_vs_in_process']:.2f}x)" for r in rows), flush=True)
                rounds.append(rows)
                load.append(os.getloadavg()[0])
            log_text = server.log_path.read_text() if server.log_path else ""
        for r in rounds[-1][1:]:
            r["ort_us_at_avg_batch"] = round(ort_us_per_run(model_file, images, max(1, round(r["avg_batch_size"])), args.threads, server_cpus), 1)
    medians = []
    for i, first in enumerate(rounds[0]):
        row = dict(first)
        for key in ("samples_per_s", "requests_per_s", "p50_ms", "p99_ms", "ratio_vs_in_process"):
            row[key] = round(float(np.median([r[i][key] for r in rounds])), 3)
        medians.append(row)

    header = f"{'mode':<30} {'threads':>7} {'conc':>4} {'samples/s':>10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>6}"
    print(f"\n{MODEL}, batch {BATCH} per request, median of {args.rounds} rounds (ratio: per round, vs that round's in-process)\n{header}\n{'-' * len(header)}")
    for r in medians:
        print(f"{r['mode']:<30} {r['threads']:>7} {r['concurrency']:>4} {r['samples_per_s']:>10.0f} {r['requests_per_s']:>8.1f} "
              f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['ratio_vs_in_process']:>6.2f}")
    print("\nwhere a served request's time goes (last round; µs; an execution runs avg-batch rows, so its compute is shared by "
          "the requests merged into it):")
    for r in rounds[-1][1:]:
        t = r["triton_us_per_request"]
        rows = max(1, round(r["avg_batch_size"]))
        print(f"  {r['mode']} c={r['concurrency']}: client p50 {r['p50_ms'] * 1000:.0f} = HTTP and client {r['p50_ms'] * 1000 - t['request_us']:.0f} "
              f"+ Triton {t['request_us']:.0f} (queue {t['queue_us']:.0f}, input copy into the stub {t['compute_input_us']:.0f}, "
              f"execution {t['compute_infer_us']:.0f} of which ONNX Runtime at batch {rows} in process {r['ort_us_at_avg_batch']:.0f}, "
              f"output {t['compute_output_us']:.0f}); client CPU {r['client_cpu_us_per_request']} µs/request")
    print(f"1-minute load average before and after each round: {', '.join(f'{x:.1f}' for x in load)}")

    import onnxruntime

    report = {
        "model": MODEL,
        "model_version": version,
        "batch": BATCH,
        "server_cpus": server_cpus,
        "client_cpus": client_cpus,
        "front_end_layouts": {"same": f"tritonserver and stubs on CPUs {server_cpus}",
                              "others": f"stubs on CPUs {server_cpus}, tritonserver on CPUs {client_cpus} (with the client)"},
        "backend_threads_logged": next((line.split("loaded", 1)[1].strip() for line in log_text.splitlines() if "onnxruntime (python) loaded" in line), None),
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "load_average_1m": load,
        "rounds": rounds,
        "rows": medians,
    }
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
