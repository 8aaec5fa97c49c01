"""The tuned serving config against the published one, same SLO, side by side in one run.

1. ``python -m pipeline tune`` on the default repository's ``digits_fp32`` (``--fresh``: every
   trial measured, so the tuning time is real), timed end to end.
2. One embedded tritonserver (pinned like the tune's, the load on the other cores) measures the
   published config and the tuned one in alternating rounds (published, tuned, published, ...),
   each round a full load ramp until p99 breaks the SLO, through the same config-override reload
   the tune uses. Alternating keeps a busy machine's drift out of the ratio; the median round of
   each is reported.

Prints the throughput under the SLO of both, their ratio and the tuning time, and writes
``reports/bench_tune.json``.

    .venv/bin/python scripts/bench_tune.py                       # builds model_repository/ if needed
    .venv/bin/python scripts/bench_tune.py --slo-p99-ms 5 --max-trials 12 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.loadtest.payload import eval_data_path
from pipeline.triton.config import parse_config
from pipeline.tune.space import Candidate, candidate_from_config, config_for_candidate
from pipeline.tune.targets import EmbeddedTarget
from pipeline.tune.trial import Requests, TrialSettings, run_trial

MODEL = "digits_fp32"


def ensure_repository(repository: Path) -> None:
    if (repository / MODEL / "config.pbtxt").is_file():
        return
    print(f"building the default model into {repository} ...", flush=True)
    subprocess.run([sys.executable, "-m", "pipeline", "build", "--repository", str(repository)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def run_tune(args: argparse.Namespace, report_dir: Path) -> tuple[dict, float]:
    command = [sys.executable, "-m", "pipeline", "tune", "--model", MODEL, "--slo-p99-ms", str(args.slo_p99_ms),
               "--max-trials", str(args.max_trials), "--cores", str(args.cores), "--repository", str(args.repository),
               "--calibration-root", str(args.calibration_root), "--report-dir", str(report_dir),
               "--cache", str(report_dir / "trials.jsonl"), "--fresh"]
    began = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3"))
    seconds = time.perf_counter() - began
    if proc.returncode not in (0, 1):
        sys.exit(f"tune failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads((report_dir / "tune.json").read_text()), seconds


def side_by_side(args: argparse.Namespace, tuned: Candidate) -> dict[str, list[dict]]:
    published = parse_config((args.repository / MODEL / "config.pbtxt").read_text())
    configs = {"published": published, "tuned": config_for_candidate(published, tuned)}
    candidates = {"published": candidate_from_config(published), "tuned": tuned}
    settings = TrialSettings(slo_p99_ms=args.slo_p99_ms)
    rounds: dict[str, list[dict]] = {"published": [], "tuned": []}
    target = EmbeddedTarget(args.repository, args.cores)
    try:
        requests = Requests(target, MODEL, published.max_batch_size, eval_data_path(MODEL, args.calibration_root))
        for r in range(args.rounds):
            for name in ("published", "tuned"):
                trial = run_trial(target, MODEL, configs[name], candidates[name], requests, settings)
                rounds[name].append(trial.to_dict())
                d = rounds[name][-1]
                verdict = "under the SLO" if d["meets_slo"] else "— misses the SLO at every load; closest point"
                print(f"round {r + 1} {name:9s} {d['infer_per_s']:>9,.0f} infer/s {verdict} "
                      f"(p99 {d['p99_ms']} ms at {d['load']})", flush=True)
    finally:
        target.close()
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--calibration-root", type=Path, default=ROOT / "calibration")
    parser.add_argument("--slo-p99-ms", type=float, default=10.0)
    parser.add_argument("--max-trials", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    ensure_repository(args.repository)

    with tempfile.TemporaryDirectory(prefix="bench-tune-") as tmp:
        doc, tune_seconds = run_tune(args, Path(tmp))
    best = Candidate.from_dict(doc["best"]["config"])
    seen = {k: f"{doc[k]['infer_per_s']:,.0f}" if doc[k]["meets_slo"] else "misses the SLO" for k in ("best", "baseline")}
    print(f"tune: {tune_seconds:.1f} s, {len(doc['trials'])} trials; best {best.label} "
          f"(in the tune: {seen['best']} infer/s; published {seen['baseline']})", flush=True)
    rounds = side_by_side(args, best)
    median = {name: statistics.median(d["infer_per_s"] if d["meets_slo"] else 0.0 for d in runs) for name, runs in rounds.items()}
    ratio = median["tuned"] / median["published"] if median["published"] else None  # None: the published config meets no load
    print(f"\nthroughput under p99 ≤ {args.slo_p99_ms:g} ms (median of {args.rounds} alternating rounds, server on {args.cores} core(s)):")
    print(f"  published {candidate_from_config(parse_config((args.repository / MODEL / 'config.pbtxt').read_text())).label}: "
          f"{median['published']:,.0f} infer/s")
    print(f"  tuned     {best.label}: {median['tuned']:,.0f} infer/s")
    shown = f"{ratio:.2f}×" if ratio is not None else "n/a (the published config meets the SLO at no load)"
    print(f"  ratio tuned / published: {shown}   tuning time: {tune_seconds:.1f} s")
    out = ROOT / "reports" / "bench_tune.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "slo_p99_ms": args.slo_p99_ms, "cores": args.cores, "max_trials": args.max_trials, "tune_seconds": round(tune_seconds, 1),
        "tune": {"best": doc["best"], "baseline": doc["baseline"], "trials": len(doc["trials"])},
        "median_infer_per_s": median, "ratio": ratio, "rounds": rounds,
        "machine": {"cpus": os.cpu_count(), "allowed": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                    "load_average": os.getloadavg()},
    }, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
