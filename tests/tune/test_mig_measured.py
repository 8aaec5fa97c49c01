"""mig-plan --from-tune: per-profile numbers from tune runs, layouts ranked by measured throughput."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import PipelineError
from pipeline.mig.measured import is_cpu_rehearsal, profile_rows, rank_layouts, read_tune_runs, with_whole_gpu_estimates
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


def test_a_whole_gpu_tune_is_the_full_profiles_capacity_and_scales_to_the_slices_as_estimates(tmp_path: Path) -> None:
    """A tune on the unpartitioned H200 (`tune --profile whole-gpu`, the tune.json shape `tune` writes)
    measures 7g.141gb; every other profile gets that capacity × its SM share, marked estimated, and so
    does every layout that uses one; a slice tuned for real replaces its estimate."""
    gpu = builtin_gpu("H200-141GB")
    whole = tune_run(tmp_path, "whole-gpu", 13200, instances=4)
    runs = with_whole_gpu_estimates(read_tune_runs([whole]), gpu)
    full = next(p for p in gpu.profiles if p.name == "7g.141gb")
    by_profile = {m.profile: m for m in runs}
    assert set(by_profile) == {p.name for p in gpu.profiles}
    assert by_profile["7g.141gb"].estimated_from is None and by_profile["7g.141gb"].infer_per_s == 13200
    small = gpu.profile("1g.18gb")
    assert by_profile["1g.18gb"].infer_per_s == pytest.approx(13200 * small.sm_count / full.sm_count)
    assert by_profile["1g.18gb"].estimated_from == f"{small.sm_count}/{full.sm_count} SMs of the whole GPU's measurement"
    assert by_profile["1g.18gb"].config["instance_count"] == 1 and by_profile["1g.18gb"].config["max_batch_size"] == 64
    ranked = rank_layouts(runs, gpu)
    assert [r.label for r in ranked if not r.estimated] == ["1x7g.141gb"]
    assert all(r.estimated for r in ranked if r.label != "1x7g.141gb")
    rows = {r["profile"]: r["source"] for r in profile_rows(runs, gpu)}
    assert rows["7g.141gb"] == "measured" and rows["3g.71gb"].startswith("estimated: ")
    # A slice measured for real keeps its measurement.
    sliced = with_whole_gpu_estimates(read_tune_runs([whole, tune_run(tmp_path, "1g.18gb", 2500)]), gpu)
    assert {m.profile: m.estimated_from for m in sliced}["1g.18gb"] is None
    proc = cli("mig-plan", "--gpu", "H200-141GB", "--from-tune", str(whole))
    assert proc.returncode == 0, proc.stderr
    assert "estimated" in proc.stdout and "1x7g.141gb" in proc.stdout
