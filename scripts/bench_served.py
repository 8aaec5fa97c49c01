"""Throughput of the served FP32 digits model vs the same file in process, side by side in one run.

In process: ``session_from_onnx(model.onnx, threads=T)`` running batch-32 inferences back to back for
``--seconds``, this process pinned to the same T cores the server gets. Served: the embedded
tritonserver on a copy of the repository holding only ``digits_fp32``, pinned to T cores
(``TritonServer(cpus=...)``), its config's ``intra_op_thread_count`` set to T and
``inter_op_thread_count`` to 1 (the parameters our onnxruntime backend reads, as the C++ one does),
driven by C concurrent tritonclient HTTP clients (threads of this process, pinned to the *other*
cores when there are any, like remote clients), each sending batch-32 requests for ``--seconds``.

The served path adds HTTP framing, Triton's scheduler (dynamic batching: concurrent batch-32 requests
may be merged up to the config's preferred 64), the Python backend's shared-memory hop into a stub
process and numpy copies. On a model this small (~0.1 ms of compute per sample) that overhead is most
of the request time, so served throughput is expected to be well below in-process; the ratio says how much.

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
import threading
import time
from contextlib import closing
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from google.protobuf import text_format

from pipeline.onnxrt import session_from_onnx
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


def bench_repository(repository: Path, dst: Path, threads: int) -> tuple[Path, int]:
    """A copy of the repository with only MODEL, its ORT thread counts set; returns it and the served version."""
    shutil.copytree(repository / MODEL, dst / MODEL, symlinks=True)
    config_path = dst / MODEL / "config.pbtxt"
    cfg = parse_config(config_path.read_text())
    cfg.parameters["intra_op_thread_count"].string_value = str(threads)
    cfg.parameters["inter_op_thread_count"].string_value = "1"
    config_path.write_text(text_format.MessageToString(cfg))
    version = max(int(p.name) for p in (dst / MODEL).iterdir() if p.is_dir() and p.name.isdigit())
    return dst, version


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


def run_served(url: str, images: np.ndarray, threads: int, concurrency: int, seconds: float, warmup: float, expected: np.ndarray) -> dict:
    import tritonclient.http as httpclient

    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(concurrency + 1)
    window: dict[str, float] = {}

    def client(index: int) -> None:
        try:
            with closing(httpclient.InferenceServerClient(url, connection_timeout=30, network_timeout=60)) as http:
                inp = httpclient.InferInput("image", list(images.shape), "FP32")
                inp.set_data_from_numpy(images, binary_data=True)
                out = [httpclient.InferRequestedOutput("probs", binary_data=True)]
                got = http.infer(MODEL, [inp], outputs=out).as_numpy("probs")
                np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)  # measure the right thing
                end = time.perf_counter() + warmup
                while time.perf_counter() < end:
                    http.infer(MODEL, [inp], outputs=out)
                barrier.wait()
                mine = latencies[index]
                while True:
                    t0 = time.perf_counter()
                    http.infer(MODEL, [inp], outputs=out)
                    t1 = time.perf_counter()
                    mine.append(t1 - t0)
                    if t1 >= window["end"]:
                        break
        except BaseException as exc:  # noqa: BLE001 - any failure (incl. a broken barrier) is re-raised after join
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    window["end"] = started + seconds
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    elapsed = time.perf_counter() - started
    return summary("served (Triton HTTP)", threads, concurrency, [x for lat in latencies for x in lat], elapsed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench_served" / "model_repository",
                        help="repository with digits_fp32 (built there if missing; default: %(default)s)")
    parser.add_argument("--workdir", type=Path, default=ROOT / "build" / "bench_served" / "build", help="build workdir if a build is needed")
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads = cores pinned, both modes (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4], help="concurrent HTTP clients (default: 1 4)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per row (default: %(default)s)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each row (default: %(default)s)")
    parser.add_argument("--report", type=Path, default=ROOT / "reports" / "bench_served.json")
    args = parser.parse_args()

    allowed = sorted(os.sched_getaffinity(0))
    if not 1 <= args.threads <= len(allowed):
        parser.error(f"--threads must be 1..{len(allowed)} (the cores this process may use)")
    server_cpus = allowed[: args.threads]
    client_cpus = [c for c in allowed if c not in server_cpus] or allowed

    repository = ensure_repository(args.repository.resolve(), args.workdir.resolve())
    with np.load(ROOT / "calibration" / "digits" / "eval.npz", allow_pickle=False) as data:
        images = np.ascontiguousarray(data["image"][:BATCH].astype(np.float32))

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-served-") as tmp:
        bench_repo, version = bench_repository(repository, Path(tmp) / "repo", args.threads)
        model_file = bench_repo / MODEL / str(version) / "model.onnx"
        expected = session_from_onnx(model_file).run(["probs"], {"image": images})[0]
        print(f"in process: {model_file.name} v{version}, {args.threads} thread(s) on CPUs {server_cpus}, {args.seconds:g} s", flush=True)
        rows.append(run_in_process(model_file, images, args.threads, server_cpus, args.seconds, args.warmup))
        with TritonServer(bench_repo, cpus=server_cpus, log_path=Path(tmp) / "tritonserver.log") as server:
            os.sched_setaffinity(0, client_cpus)  # clients off the server's cores when there are others
            try:
                for concurrency in args.concurrency:
                    print(f"served: {concurrency} HTTP client(s) on CPUs {client_cpus}, server on CPUs {server_cpus}, {args.seconds:g} s", flush=True)
                    rows.append(run_served(server.http_url, images, args.threads, concurrency, args.seconds, args.warmup, expected))
            finally:
                os.sched_setaffinity(0, allowed)
            log_text = server.log_path.read_text() if server.log_path else ""
    base = rows[0]["samples_per_s"]
    for row in rows:
        row["ratio_vs_in_process"] = round(row["samples_per_s"] / base, 3)

    header = f"{'mode':<22} {'threads':>7} {'conc':>4} {'samples/s':>10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>6}"
    print(f"\n{MODEL}, batch {BATCH} per request\n{header}\n{'-' * len(header)}")
    for r in rows:
        print(f"{r['mode']:<22} {r['threads']:>7} {r['concurrency']:>4} {r['samples_per_s']:>10.0f} {r['requests_per_s']:>8.1f} "
              f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['ratio_vs_in_process']:>6.2f}")
    print("served = tritonserver 2.51 + our Python-based onnxruntime backend (HTTP, scheduler, shared-memory hop into the "
          "backend stub, numpy copies); the gap to in-process is that overhead, not ONNX Runtime.")

    import onnxruntime

    report = {
        "model": MODEL,
        "model_version": version,
        "batch": BATCH,
        "server_cpus": server_cpus,
        "client_cpus": client_cpus,
        "backend_threads_logged": next((line.split("loaded", 1)[1].strip() for line in log_text.splitlines() if "onnxruntime (python) loaded" in line), None),
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": rows,
    }
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
