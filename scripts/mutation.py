"""Mutation testing of the modules that decide a verdict, with mutmut 3 (configured in pyproject.toml's ``[tool.mutmut]``).

mutmut copies the tree into ``mutants/`` (git-ignored), mutates the verdict modules (taskstats, gates
and bounds, judging, compare, outputkinds, triton/verify and served_gate, stages/parity) and runs, for
each mutant, the fast tests that cover the function it changed (``-m "not slow"``, the test files
listed in the config). A mutant that no test kills is a check that cannot fail for that change.

    python scripts/mutation.py                              # every verdict module, one after another
    python scripts/mutation.py --module pipeline.accuracy.taskstats  # one module (repeatable)
    python scripts/mutation.py --fresh                      # forget earlier results (mutants/ removed)
    python scripts/mutation.py --report-only                # the table of the last run

Prints a table per module (killed, survived, no tests, timeouts, score) and every survivor; writes
``mutants/summary.json``. Exit status 1 when a survivor is not listed in EQUIVALENT below (each with
the reason why no test can tell it from the original) or a listed one is killed or gone, 0 otherwise. Results: docs/mutation.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTMUT = [sys.executable, "-m", "mutmut"]
MODULES = (
    "pipeline.accuracy.taskstats", "pipeline.accuracy.gates", "pipeline.accuracy.bounds", "pipeline.accuracy.judging",
    "pipeline.accuracy.compare", "pipeline.accuracy.outputkinds",
    "pipeline.triton.verify", "pipeline.triton.served_gate", "pipeline.stages.parity",
)
# Mutants no test can kill because the mutated program behaves the same (name → why). docs/mutation.md lists them.
EQUIVALENT: dict[str, str] = json.loads((ROOT / "scripts" / "mutation_equivalent.json").read_text())
# Functions called once, when their module is imported (they make dataclass fields): mutmut runs each mutant in a
# process forked after the import, so no test there can see it. tests/accuracy/test_gates.py reads these options in a fresh
# interpreter (test_build_and_verify_share_the_documented_drop_limits_and_refuse_bad_ones); checked by hand there.
IMPORT_TIME = ("pipeline.accuracy.gates.x_fp16_max_drop_option", "pipeline.accuracy.gates.x_int8_max_drop_option",
               "pipeline.accuracy.gates.x_confidence_option")


def run_module(module: str, only_survivors: bool = False) -> int:
    """``mutmut run 'MODULE.*'``: mutants of one module only (the stats pass covers the configured tests);
    ``only_survivors``: just the mutants that survived its last run (after adding tests)."""
    env = dict(os.environ, PYTHONHASHSEED="0", TF_CPP_MIN_LOG_LEVEL="3")
    names = [f"{module}.*"]
    if only_survivors:
        names = [n for n, s in results().get(module, {}).items() if s not in ("killed", "caught by type check")]
        if not names:
            return 0
    return subprocess.call([*MUTMUT, "run", "--max-children", str(os.cpu_count() or 2), *names], cwd=ROOT, env=env)


def results() -> dict[str, dict[str, str]]:
    """Per module, each mutant's status, read from mutmut's ``.meta`` files under ``mutants/``."""
    from mutmut.stats import status_by_exit_code  # mutmut's classes: 1 = a test failed (killed), 0 = survived, ...

    found: dict[str, dict[str, str]] = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        module = ".".join(meta.relative_to(ROOT / "mutants").with_suffix("").with_suffix("").parts)
        if module not in MODULES:
            continue
        codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
        found[module] = {name: status_by_exit_code[code] for name, code in codes.items()}
    return found


def summary(found: dict[str, dict[str, str]]) -> dict:
    """Counts and score per module: killed / (killed + survivors − equivalent − import-time). Mutants of functions no fast test
    calls ("no tests": the I/O shells that run TensorFlow or Triton, covered by the slow end-to-end tests) are
    counted apart, with those functions named (``not_reached``)."""
    rows = {}
    for module, statuses in found.items():
        counts: dict[str, int] = {}
        for status in statuses.values():
            counts[status] = counts.get(status, 0) + 1
        survivors = sorted(n for n, s in statuses.items() if s in ("survived", "timeout", "suspicious"))
        import_time = [n for n in survivors if n.rsplit("__mutmut_", 1)[0] in IMPORT_TIME]
        survivors = [n for n in survivors if n not in import_time]
        equivalent = [n for n in survivors if n in EQUIVALENT]
        killed = counts.get("killed", 0) + counts.get("caught by type check", 0)
        judged = killed + len(survivors) - len(equivalent)
        unreached = sorted({n.rsplit("__mutmut_", 1)[0] for n, s in statuses.items() if s == "no tests"})
        # A listed equivalent that a test now kills, or that no longer exists (mutmut numbers a function's mutants
        # anew when its code changes): its reason is about another mutant, or about none.
        stale = sorted(n for n in EQUIVALENT if n.startswith(f"{module}.x") and statuses.get(n, "gone") in ("killed", "caught by type check", "gone"))
        rows[module] = {"mutants": len(statuses), **counts, "equivalent": len(equivalent), "import_time": len(import_time), "score": round(killed / judged, 4) if judged else None,
                        "survivors": [n for n in survivors if n not in EQUIVALENT], "equivalent_mutants": equivalent,
                        "not_reached": unreached, "stale_equivalents": stale}  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", action="append", choices=MODULES, help="mutate only this module (repeatable; default: all)")
    parser.add_argument("--fresh", action="store_true", help="remove mutants/ first (no cached results)")
    parser.add_argument("--report-only", action="store_true", help="print the last run's results, run nothing")
    parser.add_argument("--survivors", action="store_true", help="run only the mutants that survived the last run")
    args = parser.parse_args()
    if args.fresh:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    if not args.report_only:
        for module in args.module or MODULES:
            print(f"== mutmut: {module}", flush=True)
            status = run_module(module, args.survivors)
            if status not in (0, 1):  # mutmut itself failed (e.g. the clean tests failed): no result to trust
                return status
    rows = summary(results())
    (ROOT / "mutants").mkdir(exist_ok=True)
    (ROOT / "mutants" / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"{'module':30} {'mutants':>7} {'killed':>6} {'survived':>8} {'no tests':>8} {'timeout':>7} {'equiv.':>6} {'import':>6} {'score':>6}")
    for module, row in rows.items():
        score = "-" if row["score"] is None else f"{row['score']:.1%}"
        print(f"{module:30} {row['mutants']:>7} {row.get('killed', 0):>6} {row.get('survived', 0):>8} {row.get('no tests', 0):>8} "
              f"{row.get('timeout', 0):>7} {row['equivalent']:>6} {row['import_time']:>6} {score:>6}")
    for module, row in rows.items():
        if row["not_reached"]:
            print(f"{module}: not reached by the fast tests: {', '.join(f.rsplit('.', 1)[1] for f in row['not_reached'])}")
    left = [n for row in rows.values() for n in row["survivors"]]
    for name in left:
        print(f"survivor (not equivalent): {name}  — see: python -m mutmut show {name}")
    stale = [n for row in rows.values() for n in row["stale_equivalents"]]
    for name in stale:
        print(f"listed as equivalent but killed or gone (its reason is stale; remove it from scripts/mutation_equivalent.json): {name}")
    return 1 if left or stale else 0


if __name__ == "__main__":
    sys.exit(main())
