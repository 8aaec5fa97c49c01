"""Served vs in-process on an NVIDIA GPU, side by side in one run per model: samples/s of each model at each
batch size in process (ONNX Runtime with the session settings and execution providers the backend gives
the model's GPU instance: `execution_providers` of the backend folder, CUDA provider, TF32 off) and served
by the embedded tritonserver (one GPU instance, the backend's fixed batch sizes) through the product's
load generator, tensors in the HTTP body (``binary``), in system shared memory (``system``) or in CUDA
shared memory (``cuda``: inputs already on the GPU, outputs written there; needs cuda-python).

    python scripts/bench_served_gpu.py --repository R --calibration-root C --out DIR \\
        --models digits_fp32 mobilenetv2_fp16 --batches 1 32 128 --transports binary system cuda

In process, a batch is ``session.run`` on numpy arrays (the host-to-device and device-to-host copies
included, as a Python caller pays them). Served rows run ``--concurrency`` requests in flight, windows of
``--seconds / 3``; Triton's per-request breakdown is kept beside each row. Writes ``DIR/bench_served_gpu.json``
and prints a table; a batch above a model's max batch size is skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from google.protobuf import json_format

from pipeline.triton.config import parse_config
from pipeline.triton.server import OUR_BACKENDS, TritonServer


def backend_modules() -> SimpleNamespace:
    """The backend folder's config and provider modules, imported as the stub imports them."""
    import pytriton

    folder = OUR_BACKENDS / "onnxruntime"
    sys.path[:0] = [str(Path(pytriton.__file__).parent / "tritonserver" / "backends" / "python"), str(folder)]
    names = {}
    for name in ("ort_backend_config", "ort_backend_providers"):
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        names.update(vars(module))
    return SimpleNamespace(**names)


def in_process(model_dir: Path, images: np.ndarray, batch: int, seconds: float, warmup: float) -> dict:
    """samples/s of ``session.run`` at ``batch`` with the GPU instance's settings and providers."""
    import onnxruntime as ort

    b = backend_modules()
    config = json_format.MessageToDict(parse_config((model_dir / "config.pbtxt").read_text()), preserving_proto_field_name=True)
    version = max(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    path = model_dir / str(version) / (config.get("default_model_filename") or "model.onnx")
    providers, _ = b.execution_providers(config, "GPU", 0, ort.get_available_providers(), b.tensorrt_loadable())
    session = ort.InferenceSession(str(path), sess_options=b.session_options_from_config(config), providers=providers)
    name = session.get_inputs()[0].name
    feed = {name: np.ascontiguousarray(np.resize(images, (batch, *images.shape[1:])))}
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        session.run(None, feed)
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        session.run(None, feed)
        runs += 1
    elapsed = time.perf_counter() - started
    return {"mode": "in-process", "providers": session.get_providers(), "samples_per_s": runs * batch / elapsed, "ms_per_batch": elapsed / runs * 1e3}


def served(url: str, model: str, data: Path, batch: int, transport: str, concurrency: int, seconds: float, warmup: float) -> dict:
    from pipeline.loadtest.client import endpoint_from_url
    from pipeline.loadtest.measure import WindowSettings
    from pipeline.loadtest.policy import ClosedLoop
    from pipeline.loadtest.runner import LoadTestSettings, run_loadtest

    window = max(seconds / 3, 0.3)
    settings = LoadTestSettings(
        endpoints=(endpoint_from_url(url),), policies=(ClosedLoop(concurrency),), models=(model,), batch_size=batch,
        windows=WindowSettings(window_s=window, warmup_s=warmup, max_s=warmup + 3 * window + 0.01, threshold=0.99, drain_s=10),
        timeout_s=30.0, data=data, shared_memory="none" if transport == "binary" else transport,
    )
    point = run_loadtest(settings).points[0]
    agg = point.aggregate
    return {"mode": f"served ({transport})", "concurrency": concurrency, "samples_per_s": agg.infer_per_s, "p50_ms": agg.latency.p50_ms,
            "p99_ms": agg.latency.p99_ms, "errors": agg.errors, "triton": agg.server}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--calibration-root", type=Path, required=True, help="<root>/<base model>/eval.npz")
    parser.add_argument("--models", nargs="+", default=["digits_fp32", "mobilenetv2_fp16"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--transports", nargs="+", choices=("binary", "system", "cuda"), default=["binary", "system", "cuda"])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import onnxruntime

    rows = []
    report = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
              "numpy": np.__version__, "concurrency": args.concurrency, "rows": rows}
    with TritonServer(args.repository, workdir=args.out / "work") as server:
        report["server_log"] = str(server.log_path)
        for model in args.models:
            model_dir = args.repository / model
            max_batch = parse_config((model_dir / "config.pbtxt").read_text()).max_batch_size
            data = args.calibration_root / model.rsplit("_", 1)[0] / "eval.npz"
            with np.load(data) as npz:
                images = np.ascontiguousarray(npz[next(k for k in npz.files if k != "labels")].astype(np.float32))
            for batch in args.batches:
                if batch > max_batch:
                    print(f"{model}: batch {batch} > max batch {max_batch}, skipped", flush=True)
                    continue
                base = in_process(model_dir, images, batch, args.seconds, args.warmup)
                row = {"model": model, "batch": batch, "in_process": base, "served": []}
                for transport in args.transports:
                    try:
                        got = served(server.http_url, model, data, batch, transport, args.concurrency, args.seconds, args.warmup)
                    except Exception as exc:  # one transport failing must not lose the others
                        got = {"mode": f"served ({transport})", "failed": f"{type(exc).__name__}: {exc}"}
                    if "samples_per_s" in got:
                        got["ratio"] = got["samples_per_s"] / base["samples_per_s"]
                    row["served"].append(got)
                rows.append(row)
                line = ", ".join(f"{s['mode']} {s.get('samples_per_s', float('nan')):,.0f} ({s.get('ratio', float('nan')):.2f}x)" for s in row["served"])
                print(f"{model} b{batch}: in-process {base['samples_per_s']:,.0f}/s; {line}", flush=True)
                (args.out / "bench_served_gpu.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.out / 'bench_served_gpu.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
