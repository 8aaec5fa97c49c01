"""The keras-hub zoo table for docs/keras-hub.md: every model of tests/zoo/hub.py built
(`build --fp16 --int8`, no `--shape`), served and verified as tests/zoo/test_hub_zoo.py does, plus
the in-process CPU latency of each variant (ONNX Runtime, the same session options the served
instances use; median of timed runs after warm-up).

    .venv/bin/python scripts/bench_zoo_hub.py                        # all models
    .venv/bin/python scripts/bench_zoo_hub.py --models hub_bert --json hub.json
    .venv/bin/python scripts/bench_zoo_hub.py --from-json hub.json     # the table again
    .venv/bin/python scripts/bench_zoo_hub.py --attention hub_bert     # attention MatMuls quantized or not

Prints a Markdown table: parity, FP16 and INT8 gates (drop with its 95% bounds), ONNX sizes, build
and serve seconds, served verification, and CPU latency per variant at batch 1 and batch 32.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.zoo holds the model definitions and the harness

from scripts.zoo_table import _gate, _size  # noqa: E402
from tests.zoo.harness import PRECISIONS, build_zoo_model, serve_zoo_model  # noqa: E402
from tests.zoo.hub import HUB_ZOO  # noqa: E402

BATCHES = (1, 32)
COLUMNS = ("model", "parity max abs", "FP16 gate", "INT8 gate", "CPU INT8 gate", "ONNX fp32/fp16/int8/int8cpu",
           "build s", "served", "CPU ms b1 fp32/fp16/int8/int8cpu", "CPU ms b32 fp32/fp16/int8/int8cpu")


def cpu_latency_ms(workdir: Path, name: str, eval_npz: Path, runs: int = 30) -> dict[str, dict[str, float]]:
    """precision → {batch → median ms} of each variant's ONNX model on this machine's CPU, on the first
    length bucket of the evaluation data."""
    import numpy as np

    from pipeline.backend.onnxrt import session_from_onnx
    from pipeline.data.arrays import load_npz
    from pipeline.data.buckets import split_buckets
    from pipeline.data.tensors import signature_from_onnx

    result: dict[str, dict[str, float]] = {}
    for precision in PRECISIONS:
        path = workdir / name / f"model.{precision}.onnx"
        if not path.is_file():
            continue
        signature = signature_from_onnx(path)
        session = session_from_onnx(path)
        bucket = next(iter(split_buckets(eval_npz, load_npz(eval_npz), signature, what="evaluation data").values()))
        result[precision] = {}
        for batch in BATCHES:
            feed = {s.name: np.ascontiguousarray(bucket[s.name][:batch], dtype=s.dtype) for s in signature.inputs}
            for _ in range(5):
                session.run(None, feed)
            times = []
            for _ in range(runs):
                began = time.perf_counter()
                session.run(None, feed)
                times.append((time.perf_counter() - began) * 1000)
            result[precision][str(batch)] = round(float(np.median(times)), 3)
    return result


def attention_matmuls(fp32_onnx: Path) -> list[str]:
    """The MatMuls of two activations (no weight input): attention's Q·Kᵀ and weights·V."""
    import onnx

    model = onnx.load(str(fp32_onnx))
    weights = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and not weights & set(n.input)]


def attention_choice(name: str) -> dict:
    """Build ``name`` twice, with the attention MatMuls quantized (the default) and kept in float
    (``--int8-keep-nodes``); each INT8 gate's accuracy drop and the CPU latency of each."""
    from dataclasses import replace

    entry = HUB_ZOO[name]
    result = {}
    with tempfile.TemporaryDirectory(prefix=f"hub-attn-{name}-") as tmp:
        quantized = build_zoo_model(entry, Path(tmp) / "quantized")
        keep = attention_matmuls(Path(tmp) / "quantized" / "build" / name / "model.fp32.onnx")
        floated = build_zoo_model(replace(entry, build_args=(*entry.build_args, "--int8-keep-nodes", ",".join(keep))), Path(tmp) / "float")
        for label, run in (("attention quantized", quantized), ("attention in float", floated)):
            root = Path(tmp) / ("quantized" if run is quantized else "float")
            result[label] = {"gates": run.gates, "build_error": run.build_error, "kept": keep if run is floated else [],
                             "cpu_ms": cpu_latency_ms(root / "build", name, root / "calibration" / name / "eval.npz")}
    return result


def row(run: dict) -> list[str]:
    """One table row from a run's JSON."""
    sizes = " / ".join(_size(run["sizes"][p]) if p in run["sizes"] else "—" for p in PRECISIONS)
    parity = max(run["parity_max_abs"].values(), default=None)
    served = "—" if not run["served"] else ("pass" if not run.get("served_error") else "FAIL")
    if run.get("per_length"):
        served += f" (lengths {', '.join(sorted({k.rsplit('@', 1)[1] for k in run['per_length']}))}: max Δ {max(run['per_length'].values()):.2g})"
    if run.get("build_error"):
        served = f"not served: {run['build_error'][:160]}"
    latency = run.get("cpu_ms", {})
    cells = [" / ".join(f"{latency[p][str(b)]:.2f}" if p in latency else "—" for p in PRECISIONS) for b in BATCHES]
    return [run["model"], "—" if parity is None else f"{parity:.1e}", _gate(run, "fp16"), _gate(run, "int8"), _gate(run, "int8cpu"),
            sizes, f"{run['build_seconds']:.0f}", served, *cells]


def table(runs: list[dict]) -> str:
    """The Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(row(r)) + " |" for r in runs])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(HUB_ZOO), help=f"comma-separated (default: all: {', '.join(HUB_ZOO)})")
    parser.add_argument("--json", type=Path, help="also write the runs as JSON here")
    parser.add_argument("--from-json", type=Path, help="print the table from runs recorded with --json (no builds)")
    parser.add_argument("--no-serve", action="store_true", help="build and time only (no server or verify)")
    parser.add_argument("--attention", metavar="MODEL", help="measure INT8 with the attention MatMuls quantized vs in float (JSON)")
    args = parser.parse_args()
    if args.attention:
        print(json.dumps(attention_choice(args.attention), indent=1))
        return 0
    if args.from_json:
        print(table(json.loads(args.from_json.read_text())))
        return 0
    runs = []
    for name in args.models.split(","):
        entry = HUB_ZOO[name]
        with tempfile.TemporaryDirectory(prefix=f"hub-{name}-") as tmp:
            began = time.perf_counter()
            run = build_zoo_model(entry, Path(tmp))
            record = run.as_json()
            if run.build_error is None:
                record["cpu_ms"] = cpu_latency_ms(Path(tmp) / "build", name, Path(tmp) / "calibration" / name / "eval.npz")
                if not args.no_serve:
                    record.update({k: v for k, v in serve_zoo_model(entry, Path(tmp), run).as_json().items()})
            record["total_seconds"] = round(time.perf_counter() - began, 1)
            runs.append(record)
            print(f"{name}: {record['total_seconds']:.0f} s", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(runs, indent=1) + "\n")
    print(table(runs))
    return 0 if all(r["build_error"] is None and not r.get("served_error") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
