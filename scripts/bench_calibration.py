"""Compare INT8 calibration methods (minmax / entropy / percentile) on one FP32 ONNX model.

For each method the model is quantized in a fresh subprocess (so peak RSS is that method's
own), then evaluated here with exact Q/DQ semantics (as TensorRT computes) on ``eval.npz``:
top-1 accuracy, its drop vs FP32, the largest absolute difference of the output
probabilities vs FP32, calibration seconds and peak RSS. Prints a table and writes JSON.

    python scripts/bench_calibration.py --model work/digits/model.onnx \\
        --calib calibration/digits/calib.npz --eval calibration/digits/eval.npz

Without ``labels`` in eval.npz, accuracy is agreement with the FP32 model's top-1.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.backend.budget import DEFAULT_MAX_MEMORY_GIB
from pipeline.backend.onnxrt import session_from_onnx
from pipeline.core.errors import PipelineError
from pipeline.data.tensors import signature_from_onnx
from pipeline.stages.calibration import calibration_from_path
from pipeline.stages.int8 import (
    CALIBRATION_METHODS,
    qdq_onnx_from_onnx,
)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _worker(args: argparse.Namespace) -> int:
    """Quantize with one method and print {seconds, peak_rss_mib, baseline_rss_mib} as JSON."""
    data = calibration_from_path(args.calib, signature_from_onnx(args.model), min_samples=1, max_samples=args.max_samples)
    baseline = _peak_rss_mib()
    started = time.perf_counter()
    qdq_onnx_from_onnx(args.model, args.out, data, method=args.worker, percentile=args.percentile, batch_size=args.batch_size, max_memory_gib=args.max_memory_gib)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "peak_rss_mib": _peak_rss_mib(), "baseline_rss_mib": baseline, "samples": data.num_samples}))
    return 0


def _predict(model: Path, batches: list[dict[str, np.ndarray]], output: str, exact_qdq: bool) -> np.ndarray:
    session = session_from_onnx(model, exact_qdq=exact_qdq)
    return np.concatenate([session.run([output], feed)[0] for feed in batches])


def _quantize_in_subprocess(args: argparse.Namespace, method: str, out: Path) -> dict[str, float]:
    command = [
        sys.executable, __file__, "--worker", method, "--model", str(args.model), "--calib", str(args.calib),
        "--out", str(out), "--percentile", str(args.percentile), "--max-memory-gib", str(args.max_memory_gib),
    ]  # fmt: skip
    if args.batch_size:
        command += ["--batch-size", str(args.batch_size)]
    if args.max_samples:
        command += ["--max-samples", str(args.max_samples)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"quantizing with {method} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="FP32 ONNX model")
    parser.add_argument("--calib", type=Path, required=True, help="calib.npz (or a calibration folder)")
    parser.add_argument("--eval", type=Path, help="eval.npz (inputs + optional labels); required unless --worker")
    parser.add_argument("--methods", nargs="+", default=list(CALIBRATION_METHODS), choices=CALIBRATION_METHODS)
    parser.add_argument("--percentile", type=float, default=99.999, help="for the percentile method")
    parser.add_argument("--batch-size", type=int, help="calibration batch size (default: sized to --max-memory-gib)")
    parser.add_argument("--max-memory-gib", type=float, default=DEFAULT_MAX_MEMORY_GIB, help="memory budget that sizes calibration batches (default: %(default)g)")
    parser.add_argument("--max-samples", type=int, help="use at most this many calibration samples")
    parser.add_argument("--output", help="model output holding probabilities (default: the first)")
    parser.add_argument("--json", type=Path, default=Path("calibration_bench.json"), help="where to write results")
    parser.add_argument("--worker", choices=CALIBRATION_METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        if args.worker:
            return _worker(args)
        if args.eval is None:
            parser.error("--eval is required")
        return _bench(args)
    except PipelineError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


def _bench(args: argparse.Namespace) -> int:
    signature = signature_from_onnx(args.model)
    output = args.output or signature.outputs[0].name
    evaluation = calibration_from_path(args.eval, signature, min_samples=1)
    batches = list(evaluation.batches(256))
    with np.load(args.eval, allow_pickle=False) as npz:
        labels = npz["labels"] if "labels" in npz.files else None
    fp32 = _predict(args.model, batches, output, exact_qdq=False)
    reference = labels if labels is not None else fp32.argmax(-1)
    fp32_accuracy = float((fp32.argmax(-1) == reference).mean())
    rows = [{"method": "fp32", "accuracy": fp32_accuracy, "accuracy_drop": 0.0, "max_abs_diff": 0.0}]
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            out = Path(tmp) / f"int8_{method}.onnx"
            cost = _quantize_in_subprocess(args, method, out)
            probs = _predict(out, batches, output, exact_qdq=True)
            accuracy = float((probs.argmax(-1) == reference).mean())
            rows.append({
                "method": method,
                "accuracy": accuracy,
                "accuracy_drop": fp32_accuracy - accuracy,
                "max_abs_diff": float(np.abs(probs - fp32).max()),
                "calibration_seconds": cost["seconds"],
                "peak_rss_mib": cost["peak_rss_mib"],
                "rss_increase_mib": cost["peak_rss_mib"] - cost["baseline_rss_mib"],
            })  # fmt: skip

    metric = "top-1 accuracy" if labels is not None else "top-1 agreement with FP32"
    print(f"{args.model}: {evaluation.num_samples} eval samples, {metric}; calibration batch {args.batch_size or f'for {args.max_memory_gib:g} GiB'}")
    header = f"{'method':<11}{'top-1':>8}{'drop':>9}{'max|Δp|':>10}{'calib s':>9}{'peak RSS MiB':>14}{'(+calib)':>10}"
    print(header)
    print("-" * len(header))
    for row in rows:
        line = f"{row['method']:<11}{row['accuracy']:>8.4f}{row['accuracy_drop']:>+9.4f}{row['max_abs_diff']:>10.5f}"
        if "calibration_seconds" in row:
            line += f"{row['calibration_seconds']:>9.2f}{row['peak_rss_mib']:>14.0f}{row['rss_increase_mib']:>10.0f}"
        print(line)
    result = {
        "model": str(args.model),
        "calibration": str(args.calib),
        "eval": str(args.eval),
        "eval_samples": evaluation.num_samples,
        "metric": metric,
        "batch_size": args.batch_size,
        "percentile": args.percentile,
        "results": rows,
    }
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
