"""Served CPU INT8 (``<name>_int8cpu``) vs served FP32 (``<name>_fp32``), batch 32, side by side in one run.

Both models come from one ``python -m pipeline build --int8`` each, published as a CPU deployment loads
them (the configs as written: FP32 with ORT's default graph level, the CPU INT8 with KIND_CPU and the
default level, thread counts left to the backend), and are served by the embedded tritonserver with
our onnxruntime backend. Models: MobileNetV2 224×224 (``tests.zoo.models:mobilenet_v2_224``, random
weights with data-fitted BatchNorm and a class-mean head: the compute of MobileNetV2, not a classifier
worth gating, see MODELS) and the bundled digits CNN.

Served: ``python -m pipeline loadtest`` (closed loop, batch-32 requests of real evaluation samples,
measurement windows until stable) on all four models in one server run, once with the inputs in the HTTP
body and once through system shared memory (``--transports``: the load generator runs on the same cores, so
the first also charges its own copying of each request to the served side); ``--rounds`` repeats that
with the order reversed each time (FP32 first, then INT8 first), so load from other processes on a
shared machine falls on both sides; the table gives the median per model and load. In process: the
same two files in ONNX Runtime sessions with the backend's settings (graph optimizations ALL, ORT's
thread default), batch 32 back to back, alternated the same way: what the served ratio would be
without HTTP and the Python backend's copies.

    .venv/bin/python scripts/bench_int8_cpu.py                    # builds build/bench_int8_cpu/ first if needed
    .venv/bin/python scripts/bench_int8_cpu.py --rounds 3 --concurrency 1,2

Prints a table and writes ``reports/bench_int8_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.backend.onnxrt import session_from_onnx  # noqa: E402

BATCH = 32
# name → (build --model, extra build args)
MODELS = {
    # A random-weight backbone at 224 is a speed subject, not a classifier worth gating: TF and ONNX Runtime
    # differ by 1.6e-4 in its probabilities (default parity tolerance 1e-4), its FP32 top-1 on its scenes is
    # 31%, and it amplifies noise (1e-2 of input noise flips 39% of its top-1; measured), so both INT8s
    # disagree with FP32 on a third of the samples. The gates run and are reported, loosened to let it publish;
    # the CPU INT8's accuracy is judged on the digits model here and on trained models in the tests.
    "mobilenet_v2_224": ("tests.zoo.models:mobilenet_v2_224", ("--parity-atol", "5e-4", "--int8-max-drop", "100")),
    "digits": (None, ()),
}
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def ensure_built(name: str, root: Path, calib: int, eval_samples: int) -> None:
    """Build ``name`` with ``--int8`` into ``root`` unless its CPU INT8 model is already published there."""
    repository, calibration = root / "model_repository", root / "calibration"
    if (repository / f"{name}_int8cpu" / "config.pbtxt").is_file():
        return
    source, extra = MODELS[name]
    if source is not None and not (calibration / name / "eval.npz").is_file():
        from tests.zoo.models import ZooModel, _image_and_label, _unit_scenes_224, mobilenet_v2_224, write_data

        entry = ZooModel(name, mobilenet_v2_224, lambda rng, n, _: _image_and_label(_unit_scenes_224(rng, n)), eval_samples=eval_samples)
        write_data(entry, calibration / name, calib=calib)
    command = [sys.executable, "-m", "pipeline", "build", "--int8", "--name", name, "--workdir", str(root / "build"),
               "--repository", str(repository), "--calibration-root", str(calibration), *(["--model", source] if source else []), *extra]
    print(f"building {name}: {' '.join(command[1:])}", flush=True)
    began = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"build of {name} failed:\n{proc.stderr[-3000:]}")
    print(f"built {name} in {time.perf_counter() - began:.0f} s", flush=True)


def served_round(root: Path, models: list[str], concurrency: str, window_ms: int, max_seconds: float, report_dir: Path,
                 shared_memory: str = "none") -> dict[tuple[str, float], float]:
    """One ``pipeline loadtest`` run over ``models`` (in that order), inputs sent in the HTTP body
    (``shared_memory="none"``) or through registered system shared memory; samples/s per (model, concurrency)."""
    command = [sys.executable, "-m", "pipeline", "loadtest", "--repository", str(root / "model_repository"),
               "--shared-memory", shared_memory,
               "--calibration-root", str(root / "calibration"), "--batch-size", str(BATCH), "--concurrency", concurrency,
               "--window-ms", str(window_ms), "--max-seconds", str(max_seconds), "--report-dir", str(report_dir),
               "--timeout-ms", "60000"]  # a 19 MB MobileNetV2 request on 2 cores shared with other work can take seconds
    for model in models:
        command += ["--model", model]
    proc = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if not (report_dir / "results.json").is_file():
        raise SystemExit(f"loadtest failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    results = json.loads((report_dir / "results.json").read_text())
    if proc.returncode != 0:  # failed requests: the point's throughput still counts the successful ones
        print(f"loadtest exit {proc.returncode}: {results.get('failures')}", flush=True)
    rates = {}
    for point in results["points"]:
        agg = point["aggregate"]
        rates[(point["model"], float(point["load"]))] = agg["requests"] * agg["batch_size"] / agg["seconds"]
    return rates


def in_process(path: Path, feed: dict[str, np.ndarray], seconds: float) -> float:
    """Samples/s of back-to-back batch inferences in an ORT session as the backend makes it (level ALL, default threads)."""
    session = session_from_onnx(path)
    for _ in range(3):
        session.run(None, feed)
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        session.run(None, feed)
        runs += 1
    return runs * BATCH / (time.perf_counter() - started)


def latest_version(model_dir: Path) -> Path:
    version = max(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    return model_dir / str(version) / "model.onnx"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT / "build" / "bench_int8_cpu", help="builds, repository, data (default: %(default)s)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="default: all")
    parser.add_argument("--concurrency", default="1,2", help="closed-loop requests in flight (default: %(default)s)")
    # The load generator shares this machine's cores with the server: with inputs in the HTTP body its own
    # serialization and sending of each 19 MB MobileNetV2 request is charged to the served side (a remote
    # client's would not be). System shared memory (as perf_analyzer's --shared-memory system) takes the
    # transfer out and leaves the server's path: both are measured, side by side.
    parser.add_argument("--transports", default="none,system", help="loadtest --shared-memory modes, comma-separated (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="served runs, order reversed each time (default: %(default)s)")
    # A MobileNetV2 batch of 32 takes 0.2-0.7 s on 2 loaded cores: 1-second windows (loadtest's default) count
    # whole requests, so throughput came out as exactly 32 or 64 samples/s; windows of several requests do not.
    parser.add_argument("--window-ms", type=int, default=4000, help="loadtest measurement window (default: %(default)s)")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="bound per load point (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=8.0, help="in-process seconds per model and round (default: %(default)s)")
    parser.add_argument("--calib", type=int, default=200, help="MobileNetV2 calibration samples (default: %(default)s)")
    parser.add_argument("--eval", type=int, default=600, help="MobileNetV2 labeled evaluation samples (default: %(default)s)")
    parser.add_argument("--report", type=Path, default=ROOT / "reports" / "bench_int8_cpu.json")
    args = parser.parse_args()
    root = args.root.resolve()

    for name in args.models:
        ensure_built(name, root, args.calib, args.eval)
    pairs = [(f"{name}_fp32", f"{name}_int8cpu") for name in args.models]
    repository = root / "model_repository"

    load_before = os.getloadavg()  # a shared machine: the load others put on it is part of the result
    local: dict[str, list[float]] = {}
    served: dict[tuple[str, str, float], list[float]] = {}
    transports = [t for t in args.transports.split(",") if t]
    for round_index in range(args.rounds):
        order = [m for pair in pairs for m in (pair if round_index % 2 == 0 else pair[::-1])]
        for model in order:
            base = model.rsplit("_", 1)[0]
            with np.load(root / "calibration" / base / "eval.npz") as data:
                feed = {k: np.ascontiguousarray(v[:BATCH]) for k, v in data.items() if k != "labels"}
            local.setdefault(model, []).append(in_process(latest_version(repository / model), feed, args.seconds))
        for transport in transports if round_index % 2 == 0 else transports[::-1]:
            print(f"round {round_index + 1}/{args.rounds}: served {', '.join(order)} at concurrency {args.concurrency}, "
                  f"shared memory {transport}", flush=True)
            rates = served_round(root, order, args.concurrency, args.window_ms, args.max_seconds,
                                 root / "reports" / f"round{round_index}-{transport}", transport)
            for (model, load), rate in rates.items():
                served.setdefault((model, transport, load), []).append(rate)

    rows = []
    for fp32, int8 in pairs:
        points = sorted({(transport, load) for model, transport, load in served if model == fp32})
        for mode, a, b in [("in process", local[fp32], local[int8])] + [
                (f"served {'http' if t == 'none' else 'shm'} c={load:g}", served[(fp32, t, load)], served[(int8, t, load)]) for t, load in points]:
            rows.append({"model": fp32.rsplit("_", 1)[0], "mode": mode, "fp32_samples_per_s": round(statistics.median(a), 1),
                         "int8cpu_samples_per_s": round(statistics.median(b), 1), "ratio": round(statistics.median(b) / statistics.median(a), 3),
                         "fp32_runs": [round(x, 1) for x in a], "int8cpu_runs": [round(x, 1) for x in b]})

    header = f"{'model':<18} {'mode':<17} {'FP32 samples/s':>15} {'INT8 CPU samples/s':>19} {'INT8/FP32':>10}"
    print(f"\nbatch {BATCH}, median of {args.rounds} round(s); 1-min load average {load_before[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs\n{header}\n{'-' * len(header)}")
    for r in rows:
        print(f"{r['model']:<18} {r['mode']:<17} {r['fp32_samples_per_s']:>15.1f} {r['int8cpu_samples_per_s']:>19.1f} {r['ratio']:>10.2f}")

    import onnxruntime

    sizes = {m: latest_version(repository / m).stat().st_size for pair in pairs for m in pair}
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                if line.startswith("Model name")), platform.processor())
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").is_file() else set()
    report = {"batch": BATCH, "rounds": args.rounds, "concurrency": args.concurrency, "transports": transports, "cpu": cpu,
              "cpu_count": os.cpu_count(), "vnni": bool(flags & {"avx512_vnni", "avx_vnni"}),
              "onnxruntime": onnxruntime.__version__, "python": platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
              "model_bytes": sizes, "rows": rows}
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
