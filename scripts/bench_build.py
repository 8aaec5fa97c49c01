"""Wall time and peak memory of each build stage, for a few Keras Applications models (random weights).

Every stage runs in its own child process. Two peaks are printed: the largest single process (from
``os.wait4``'s rusage, no psutil) and the process tree's — the build and every child it starts
(the SavedModel export, tf2onnx), RSS and PSS summed over the tree, sampled from /proc every 50 ms.
The last row runs the whole ``python -m pipeline build --fp16 --int8`` in a fresh workdir, each of its stages'
tree peak tagged from the build's ``<stage> running…`` lines (the largest single process is not told apart
there): the highest is what a user's machine must hold, and is judged against the memory budget (``--max-memory-gib``).

    python scripts/bench_build.py                          # resnet50 at 224×224, budget 2 GiB
    python scripts/bench_build.py --models resnet50 mobilenetv3small densenet121 --samples 256
    python scripts/bench_build.py --models resnet50 --stages int8 --max-memory-gib 1
    python scripts/bench_build.py --sizes 0.1 1 2.5      # recommenders of 0.1, 1 and 2.5 GB of weights, whole builds

``--sizes`` builds the recommender of tests/big_models.py at each size of weights (GB) with ``build --fp16 --int8
--verify-served`` and tags every 50 ms sample of the process tree with the stage the build's log says is running:
peak RSS and seconds per stage, each peak against the build's rule (3 × the FP32 weights + 1.5 GiB), and how each
stage's peak grows with the weights (MiB per GB, between the two largest sizes).

Artifacts go to ``--workdir`` (default: a temporary folder); stages reuse earlier stages' outputs
there, so ``--stages int8`` after a full run measures calibration alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.backend.budget import DEFAULT_MAX_MEMORY_GIB  # noqa: E402

MODELS = {  # name: (keras.applications constructor, input H×W×C)
    "resnet50": ("ResNet50", (224, 224, 3)),
    "mobilenetv3small": ("MobileNetV3Small", (224, 224, 3)),
    "densenet121": ("DenseNet121", (160, 160, 3)),
}
STAGES = ("savedmodel", "onnx", "parity", "fp16", "int8", "accuracy", "build")
EVAL_SAMPLES = 128


def _paths(workdir: Path, model: str) -> dict[str, Path]:
    root = workdir / model
    return {
        "keras": root / f"{model}.keras",
        "savedmodel": root / "savedmodel",
        "fp32": root / "model.fp32.onnx",
        "fp16": root / "model.fp16.onnx",
        "int8": root / "model.int8.onnx",
        "calib": root / "calib.npz",
        "parity": root / "parity.json",
        "accuracy": root / "accuracy.json",
        "build": root / "build",
        "repository": root / "model_repository",
    }


def _worker(stage: str, model: str, workdir: Path, samples: int, budget: float, batch: int | None) -> None:
    """Run one stage in this (child) process."""
    import numpy as np

    from pipeline.accuracy.evaldata import synthetic_eval_data
    from pipeline.build.support import eval_batch
    from pipeline.data.tensors import signature_from_onnx

    p = _paths(workdir, model)
    if stage == "savedmodel":
        import keras

        from pipeline.stages.savedmodel import savedmodel_from_keras

        constructor, shape = MODELS[model]
        keras.utils.set_random_seed(0)
        net = getattr(keras.applications, constructor)(weights=None, input_shape=shape)
        p["keras"].parent.mkdir(parents=True, exist_ok=True)
        net.save(p["keras"])
        savedmodel_from_keras(net, p["savedmodel"])
    elif stage == "onnx":
        from pipeline.stages.onnx_export import onnx_from_savedmodel

        onnx_from_savedmodel(p["savedmodel"], p["fp32"], 17)
        spec = signature_from_onnx(p["fp32"]).inputs[0]  # calibration data named after the ONNX input
        rng = np.random.default_rng(0)
        np.savez(p["calib"], **{spec.name: rng.random((samples, *MODELS[model][1]), dtype=np.float32)})
    elif stage == "parity":
        from pipeline.stages.parity import parity_report_from_models

        data = synthetic_eval_data(signature_from_onnx(p["fp32"]), samples=EVAL_SAMPLES)
        size = eval_batch(p["fp32"], data, budget, runners=2)  # as the build sizes it
        print(f"parity batch {size}", file=sys.stderr)
        parity_report_from_models(p["savedmodel"], p["fp32"], data, p["parity"], atol=1e-3, rtol=0.0, batch_size=size)
    elif stage == "fp16":
        from pipeline.stages.fp16 import fp16_onnx_from_onnx

        fp16_onnx_from_onnx(p["fp32"], p["fp16"])
    elif stage == "int8":
        from pipeline.stages.calibration import calibration_from_path
        from pipeline.stages.int8 import qdq_onnx_from_onnx

        data = calibration_from_path(p["calib"], signature_from_onnx(p["fp32"]))
        qdq_onnx_from_onnx(p["fp32"], p["int8"], data, max_memory_gib=budget, batch_size=batch)
    elif stage == "accuracy":
        from pipeline.build.config import Gates
        from pipeline.data.artifacts import Artifact
        from pipeline.stages.accuracy import accuracy_report_from_variants

        signature = signature_from_onnx(p["fp32"])
        data = synthetic_eval_data(signature, samples=EVAL_SAMPLES)
        variants = [Artifact(v, "onnx", p[v]) for v in ("fp16", "int8") if p[v].is_file()]
        size = eval_batch(p["fp32"], data, budget, runners=1 + len(variants))  # as the build sizes it
        print(f"accuracy batch {size}", file=sys.stderr)
        try:
            accuracy_report_from_variants(p["fp32"], variants, data, p["accuracy"], gates=Gates(), signature=signature, batch_size=size)
        except Exception as exc:  # noqa: BLE001 - a failed gate on random weights still measured the memory
            print(f"accuracy: {exc}", file=sys.stderr)
    else:
        raise SystemExit(f"unknown stage {stage}")


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (Linux /proc/<pid>/task/<tid>/children)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
        except OSError:  # exited meanwhile
            continue
    return pids


def _rss_pss(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in bytes; zeros once it is gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


def _measure(command: list[str], log: Path) -> dict[str, float]:
    """Seconds, exit status, the largest process's peak RSS, and the process tree's peak summed RSS and
    PSS (sampled every 50 ms) of one command."""
    started = time.perf_counter()
    tree_rss = tree_pss = 0
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            sizes = [_rss_pss(p) for p in _tree(proc.pid)]
            tree_rss = max(tree_rss, sum(r for r, _ in sizes))
            tree_pss = max(tree_pss, sum(p for _, p in sizes))
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    mib = 1024 * 1024
    return {"seconds": time.perf_counter() - started, "exit": proc.returncode, "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux: KiB
            "tree_rss_mib": tree_rss / mib, "tree_pss_mib": tree_pss / mib}


RECOMMENDERS = {0.1: "recommender_100m", 1.0: "recommender_1g", 2.2: "recommender_2g2", 2.5: "recommender_2g5"}  # GB of weights: tests/big_models.py


def _staged_measure(command: list[str], log: Path) -> tuple[dict[str, dict[str, float]], float, int]:
    """Run ``command``; per stage its seconds and its peak process-tree RSS (MiB), the stage read from the build's
    ``<stage> running…`` lines as they are written; also the total seconds and the exit status."""
    started = time.perf_counter()
    stages: dict[str, dict[str, float]] = {}
    current, since, seen = "start", started, 0
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        while True:
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            now = time.perf_counter()
            text = log.read_text(errors="replace")
            for line in text[seen:].splitlines():
                words = line.split()
                after_publish = words[:1] == ["publish"] and ("done" in words or "skipped" in words)  # then the served check
                if len(words) >= 2 and words[1] == "running…" or after_publish:
                    stages.setdefault(current, {"seconds": 0.0, "peak_mib": 0.0})["seconds"] += now - since
                    current, since = ("served" if after_publish else words[0]), now
            seen = len(text)
            rss = sum(_rss_pss(p)[0] for p in _tree(proc.pid)) / (1 << 20)
            entry = stages.setdefault(current, {"seconds": 0.0, "peak_mib": 0.0})
            entry["peak_mib"] = max(entry["peak_mib"], rss)
            if pid:
                break
            time.sleep(0.05)
    stages.setdefault(current, {"seconds": 0.0, "peak_mib": 0.0})["seconds"] += time.perf_counter() - since
    return stages, time.perf_counter() - started, os.waitstatus_to_exitcode(status)


def _sizes(args: argparse.Namespace, workdir: Path) -> list[dict]:
    """Whole builds of the recommender at each of ``args.sizes``; prints the per-stage table and the growth."""
    from tests.big_models import rows_for, write_data

    rows = []
    for size in args.sizes:
        root = workdir / f"recommender-{size:g}g"
        calib, evaluation = write_data(root / "data", rows_for(size))
        command = [sys.executable, "-m", "pipeline", "build", "--model", f"tests.big_models:{RECOMMENDERS[size]}", "--name", "items", "--fp16",
                   "--int8", "--no-engine", "--verify-served", "--calibration", str(calib), "--eval-data", str(evaluation),
                   "--workdir", str(root / "build"), "--repository", str(root / "repo")]  # fmt: skip
        stages, seconds, status = _staged_measure(command, root / "build.log")
        weights = sum(f.stat().st_size for f in (root / "build" / "items").glob("model.fp32.onnx*") if not f.name.endswith(".json"))
        limit = (3 * weights + 1.5 * (1 << 30)) / (1 << 20)
        for stage, entry in stages.items():
            rows.append({"size_gb": size, "weights_mib": weights / (1 << 20), "stage": stage, **entry, "limit_mib": limit, "exit": status})
        print(f"{size:g} GB: exit {status}, {seconds:.0f} s, tree peak {max(e['peak_mib'] for e in stages.values()):.0f} MiB "
              f"(limit {limit:.0f} MiB)", flush=True)
    header = f"{'weights':>9}{'stage':>12}{'seconds':>9}{'peak MiB':>10}{'limit MiB':>11}{'of limit':>10}"
    print("\n" + header + "\n" + "-" * len(header))
    for row in rows:
        print(f"{row['weights_mib']:>5.0f} MiB{row['stage']:>12}{row['seconds']:>9.1f}{row['peak_mib']:>10.0f}{row['limit_mib']:>11.0f}"
              f"{row['peak_mib'] / row['limit_mib']:>10.0%}" + ("" if row["exit"] == 0 else f"  (exit {row['exit']})"))
    if len(args.sizes) >= 2:
        small, large = sorted(args.sizes)[-2:]
        print(f"\ngrowth of each stage's peak between {small:g} and {large:g} GB of weights (MiB of RSS per MiB of weights):")
        by = {(r["size_gb"], r["stage"]): r for r in rows}
        for stage in dict.fromkeys(r["stage"] for r in rows):
            a, b = by.get((small, stage)), by.get((large, stage))
            if a and b and b["weights_mib"] > a["weights_mib"]:
                print(f"  {stage:<12}{(b['peak_mib'] - a['peak_mib']) / (b['weights_mib'] - a['weights_mib']):>6.2f}")
    return rows


def _command(stage: str, model: str, workdir: Path, args: argparse.Namespace) -> list[str]:
    if stage != "build":
        command = [sys.executable, __file__, "--worker", stage, "--models", model, "--workdir", str(workdir),
                "--samples", str(args.samples), "--max-memory-gib", str(args.max_memory_gib)]  # fmt: skip
        return command + (["--calibration-batch", str(args.calibration_batch)] if args.calibration_batch else [])
    p = _paths(workdir, model)
    command = [sys.executable, "-m", "pipeline", "build", "--model", str(p["keras"]), "--fp16", "--int8", "--no-engine",
               "--calibration", str(p["calib"]), "--workdir", str(p["build"]), "--repository", str(p["repository"])]  # fmt: skip
    if args.max_memory_gib is not None and args.pass_budget:
        command += ["--max-memory-gib", str(args.max_memory_gib)]
    return command


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet50"], choices=sorted(MODELS))
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--samples", type=int, default=256, help="calibration samples (random uniform 0..1)")
    parser.add_argument("--max-memory-gib", type=float, default=DEFAULT_MAX_MEMORY_GIB, help="memory budget (default: %(default)g)")
    parser.add_argument("--calibration-batch", type=int, help="fixed calibration batch instead of the budget's (to compare)")
    parser.add_argument("--pass-budget", action="store_true", help="pass --max-memory-gib to the whole build (needs the CLI option)")
    parser.add_argument("--workdir", type=Path, help="where artifacts go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=Path("build_bench.json"))
    parser.add_argument("--sizes", nargs="+", type=float, choices=sorted(RECOMMENDERS), help="recommender builds of these GB of weights instead")
    parser.add_argument("--worker", choices=STAGES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        _worker(args.worker, args.models[0], args.workdir, args.samples, args.max_memory_gib, args.calibration_batch)
        return 0

    with tempfile.TemporaryDirectory(prefix="bench_build.") as tmp:
        workdir = args.workdir or Path(tmp)
        if args.sizes:
            results = _sizes(args, workdir)
            args.json.write_text(json.dumps({"sizes": args.sizes, "results": results}, indent=2) + "\n")
            print(f"wrote {args.json}")
            return 0
        rows = []
        for model in args.models:
            _paths(workdir, model)["keras"].parent.mkdir(parents=True, exist_ok=True)
            for stage in args.stages:
                log = workdir / model / f"{stage}.log"
                if stage == "build":  # each build stage's own peak, the stage read from the build's log lines; a fresh workdir
                    shutil.rmtree(_paths(workdir, model)["build"], ignore_errors=True)
                    stages, seconds, status = _staged_measure(_command(stage, model, workdir, args), log)
                    row = {"model": model, "stage": stage, "seconds": seconds, "exit": status, "peak_rss_mib": float("nan"),
                           "tree_rss_mib": max(e["peak_mib"] for e in stages.values()), "tree_pss_mib": float("nan"), "stages": stages}
                    for name, entry in stages.items():
                        print(f"{'':<18}{'  ' + name:<12}{entry['seconds']:>9.1f} s  tree {entry['peak_mib']:.0f} MiB", flush=True)
                else:
                    row = {"model": model, "stage": stage, **_measure(_command(stage, model, workdir, args), log)}
                rows.append(row)
                status = row["exit"]
                flag = "" if status == 0 else f"  exit {status}: see {log}" + ("" if args.workdir else " (temporary)")
                print(f"{model:<18}{stage:<12}{row['seconds']:>9.1f} s{row['peak_rss_mib']:>8.0f} MiB, tree {row['tree_rss_mib']:.0f} MiB{flag}", flush=True)
                if status != 0 and stage != "build":
                    print(log.read_text()[-1500:], file=sys.stderr)
                    break
        budget_mib = args.max_memory_gib * 1024
        print(f"\nbudget --max-memory-gib {args.max_memory_gib:g} = {budget_mib:.0f} MiB")
        header = f"{'model':<18}{'stage':<12}{'wall s':>9}{'process MiB':>13}{'tree RSS MiB':>14}{'tree PSS MiB':>14}{'of budget':>11}"
        print(header)
        print("-" * len(header))
        for row in rows:
            print(f"{row['model']:<18}{row['stage']:<12}{row['seconds']:>9.1f}{row['peak_rss_mib']:>13.0f}{row['tree_rss_mib']:>14.0f}"
                  f"{row['tree_pss_mib']:>14.0f}{row['tree_rss_mib'] / budget_mib:>10.0%}" + ("" if row["exit"] == 0 else f"  (exit {row['exit']})"))  # fmt: skip
        print("process: the largest single process; tree: the command and all its children together, sampled every 50 ms; "
              "of budget: tree RSS / budget")
        args.json.write_text(json.dumps({"max_memory_gib": args.max_memory_gib, "samples": args.samples, "results": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
