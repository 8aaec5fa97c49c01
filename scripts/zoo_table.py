"""The model zoo table for the README: every zoo model built (`build --fp16 --int8`, no `--shape`),
served, verified and load-tested once at concurrency 4, exactly as tests/zoo/test_zoo.py does.

    .venv/bin/python scripts/zoo_table.py                      # all models (tens of minutes on 2 cores)
    .venv/bin/python scripts/zoo_table.py --models lstm,transformer --json zoo.json
    .venv/bin/python scripts/zoo_table.py --from-json zoo.json   # the table again, from recorded runs

Prints a Markdown table: per model, conversion parity (TF vs ONNX max abs difference), the FP16 and
INT8 gates (verdict and the drop with its bounds), build time, ONNX sizes, the TensorRT 10.5 parser
check, served verification and load-test throughput.
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

from tests.zoo.harness import ZooRun, build_zoo_model, serve_zoo_model  # noqa: E402
from tests.zoo.models import ZOO  # noqa: E402

COLUMNS = ("model", "parity max abs", "FP16 gate", "INT8 gate", "build s", "ONNX MB fp32/fp16/int8", "TRT 10.5 parser", "served", "c=4 infer/s (fp32/fp16/int8)")


def _gate(run: dict, precision: str) -> str:
    gate = run["gates"].get(precision)
    if gate is None:
        return "—"
    verdict = "pass" if gate["passed"] else "FAIL"
    drop = gate.get("drop")
    if isinstance(drop, dict) and "drop_points" in drop:
        return f"{verdict} ({drop['drop_points']:+.2f} pt, ≤ {drop['high_points']:.2f})"
    agree = gate.get("top1_agreement")
    return f"{verdict} (agree {agree:.1%})" if agree is not None else verdict


def row(run: dict) -> list[str]:
    """One table row from a :class:`ZooRun` as JSON."""
    mb = "/".join(f"{run['sizes'][p] / 2**20:.1f}" if p in run["sizes"] else "—" for p in ("fp32", "fp16", "int8"))
    parity = max(run["parity_max_abs"].values(), default=None)
    served = "—" if not run["served"] else ("pass" if not run.get("served_error") else "FAIL")
    if run.get("per_length"):
        served += f" (lengths {', '.join(sorted({k.rsplit('@', 1)[1] for k in run['per_length']}))}: Δ ≤ {max(run['per_length'].values()):.0e})"
    rates = "/".join(f"{run['loadtest'][m]['throughput_rps']:.0f}" if m in run["loadtest"] else "—" for m in (f"{run['model']}_{p}" for p in ("fp32", "fp16", "int8")))
    parser = run.get("parser")
    parser_cell = "—" if parser is None else ("ok" if not any(parser.values()) else "; ".join(p for ps in parser.values() for p in ps)[:80])
    build = f"{run['build_seconds']:.0f}" + (f" (error: {run['build_error'][7:90]})" if run.get("build_error") else "")
    return [run["model"], "—" if parity is None else f"{parity:.1e}", _gate(run, "fp16"), _gate(run, "int8"), build, mb, parser_cell, served, rates]


def table(runs: list[dict]) -> str:
    """The Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(r)) + " |" for r in runs]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ZOO), help=f"comma-separated zoo models (default: all: {', '.join(ZOO)})")
    parser.add_argument("--json", type=Path, help="also write the runs as JSON here")
    parser.add_argument("--from-json", type=Path, help="print the table from runs recorded with --json (no builds)")
    parser.add_argument("--no-serve", action="store_true", help="build only (no server, verify or load test)")
    args = parser.parse_args()
    if args.from_json:
        print(table(json.loads(args.from_json.read_text())))
        return 0
    runs = []
    for name in args.models.split(","):
        entry = ZOO[name]
        with tempfile.TemporaryDirectory(prefix=f"zoo-{name}-") as tmp:
            began = time.perf_counter()
            run: ZooRun = build_zoo_model(entry, Path(tmp))
            if run.build_error is None and not args.no_serve:
                serve_zoo_model(entry, Path(tmp), run)
            runs.append(run.as_json())
            print(f"{name}: {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(runs, indent=1) + "\n")
    print(table(runs))
    return 0 if all(r["build_error"] is None and not r.get("served_error") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
