"""mig-plan --from-tune: per-profile numbers from tune runs, layouts ranked by measured throughput."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import PipelineError
from pipeline.mig.measured import is_cpu_rehearsal, profile_rows, rank_layouts, read_tune_runs
from pipeline.mig.profiles import builtin_gpu
from tests.conftest import cli


def tune_run(root: Path, profile: str, infer_per_s: float, slo: float = 10.0, instances: int = 1) -> Path:
    run = root / profile
    run.mkdir(parents=True)
    best = {"config": {"instance_count": instances, "max_batch_size": 64, "preferred_batch_sizes": [32, 64], "max_queue_delay_us": 0},
            "infer_per_s": infer_per_s, "p99_ms": 4.0, "load": {"concurrency": 16}, "meets_slo": True}
    (run / "tune.json").write_text(json.dumps({"slo_p99_ms": slo, "profile": profile,
                                               "models": {"digits_fp32": {"baseline": best, "best": best, "trials": [best]}}}))
    return run


def test_cpu_rehearsal_answers_one_big_or_two_small_servers(tmp_path: Path) -> None:
    runs = read_tune_runs([tune_run(tmp_path, "cpu-1", 1000), tune_run(tmp_path, "cpu-2", 1500, instances=2)])
    assert is_cpu_rehearsal(runs)
    ranked = rank_layouts(runs, None, cores=2)
    assert [(r.label, r.total_infer_per_s) for r in ranked] == [("2xcpu-1", 2000), ("1xcpu-2", 1500), ("1xcpu-1", 1000)]
    rows = profile_rows(runs, None)
    assert {r["profile"]: (r["source"], r["instances"]) for r in rows} == {"cpu-1": ("measured", 1), "cpu-2": ("measured", 2)}


def test_gpu_layouts_use_the_profile_table_and_mark_unmeasured_profiles(tmp_path: Path) -> None:
    gpu = builtin_gpu("A100-80GB")
    runs = read_tune_runs([tune_run(tmp_path, "1g.10gb", 1000), tune_run(tmp_path, "3g.40gb", 2500)])
    ranked = rank_layouts(runs, gpu)
    # 7 × 1g (7 compute slices) beats 2 × 3g (6) and mixes; 3g + 4×1g is placeable too.
    assert ranked[0].label == "7x1g.10gb" and ranked[0].total_infer_per_s == 7000
    assert {r.label for r in ranked} >= {"2x3g.40gb", "4x1g.10gb,1x3g.40gb"}
    assert all(sum(n * int(p[0]) for p, n in r.counts.items()) <= 7 for r in ranked)
    unmeasured = [r for r in profile_rows(runs, gpu) if r["source"] != "measured"]
    assert {r["profile"] for r in unmeasured} == {"1g.10gb+me", "1g.20gb", "2g.20gb", "4g.40gb", "7g.80gb"}
    assert all("heuristic" in r["source"] for r in unmeasured)


def test_runs_with_different_slos_or_no_profile_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="different SLOs"):
        read_tune_runs([tune_run(tmp_path / "a", "cpu-1", 1000, slo=10), tune_run(tmp_path / "b", "cpu-2", 1000, slo=5)])
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tune.json").write_text(json.dumps({"slo_p99_ms": 10, "profile": None, "models": {}}))
    with pytest.raises(PipelineError, match="not labelled with a profile"):
        read_tune_runs([bare])


def test_cli_prints_the_measured_plan(tmp_path: Path) -> None:
    proc = cli("mig-plan", "--from-tune", str(tune_run(tmp_path, "cpu-1", 1000)), "--from-tune", str(tune_run(tmp_path, "cpu-2", 2500)))
    assert proc.returncode == 0, proc.stderr
    assert "best measured layout 1xcpu-2 — 2,500 infer/s" in proc.stdout
    assert "measured" in proc.stdout
    missing = cli("mig-plan", "--from-tune", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "holds no tune.json" in missing.stderr
