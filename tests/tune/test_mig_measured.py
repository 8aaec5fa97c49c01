"""mig-plan --from-tune: per-profile numbers from tune runs, layouts ranked by measured throughput."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.mig.measured import is_cpu_rehearsal, profile_rows, rank_layouts, read_tune_runs, with_whole_gpu_estimates
from pipeline.mig.plan import budget_bytes
from pipeline.mig.profiles import builtin_gpu
from pipeline.tune.gpu_memory import MIB, GpuMemory
from tests.conftest import ROOT, cli


def tune_run(root: Path, profile: str, infer_per_s: float, slo: float = 10.0, instances: int = 1, gpu_mib: int | None = None) -> Path:
    """A tune.json as `tune` writes it; ``gpu_mib``: the best config's measured GPU MiB per instance."""
    run = root / profile
    run.mkdir(parents=True)
    best = {"config": {"instance_count": instances, "max_batch_size": 64, "preferred_batch_sizes": [32, 64], "max_queue_delay_us": 0},
            "infer_per_s": infer_per_s, "p99_ms": 4.0, "load": {"concurrency": 16}, "meets_slo": True}
    if gpu_mib is not None:
        best["gpu_memory"] = GpuMemory(586 * MIB, 586 * MIB + instances * gpu_mib * MIB, 586 * MIB + instances * gpu_mib * MIB,
                                       instances, 1).to_dict()
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


def test_measured_memory_per_instance_caps_instances_and_leaves_out_profiles_it_does_not_fit(tmp_path: Path) -> None:
    """A whole-H200 run of 8 instances of 15 GiB each: 1g.18gb (13,9xx MiB usable) cannot hold one, so it
    has no capacity, says why and is in no layout; the 35 GB profiles hold 1 of the 2 instances their SM
    share gives (capacity halved, estimated); 3g/4g.71gb hold their 4; the ranking follows."""
    gpu = builtin_gpu("H200-141GB")
    plain = with_whole_gpu_estimates(read_tune_runs([tune_run(tmp_path / "plain", "whole-gpu", 12000, instances=8)]), gpu)
    runs = with_whole_gpu_estimates(read_tune_runs([tune_run(tmp_path / "mem", "whole-gpu", 12000, instances=8, gpu_mib=15 * 1024)]), gpu)
    by = {m.profile: m for m in runs}
    unchecked = {m.profile: m for m in plain}
    assert all(m.gpu_bytes_per_instance == 15 * 1024 * MIB for m in runs)

    small = gpu.profile("1g.18gb")
    assert budget_bytes(small) < 15 * 1024 * MIB and unchecked["1g.18gb"].config["instance_count"] == 1
    assert (by["1g.18gb"].memory_fit, by["1g.18gb"].infer_per_s) == (0, 0)
    rows = {r["profile"]: r for r in profile_rows(runs, gpu)}
    assert rows["1g.18gb"]["source"] == f"does not fit: 15,360 MiB per instance measured, {budget_bytes(small) / MIB:,.0f} MiB usable"
    assert rows["1g.18gb"]["instances"] == 0 and rows["1g.18gb"]["infer_per_s"] is None
    assert rows["1g.18gb"]["gpu_mib_per_instance"] == 15 * 1024

    for name in ("1g.35gb", "2g.35gb"):
        assert unchecked[name].config["instance_count"] == 2  # the SM share of 8
        assert (by[name].memory_fit, by[name].config["instance_count"]) == (1, 1)
        assert by[name].infer_per_s == pytest.approx(unchecked[name].infer_per_s / 2)
        assert "1 of 2 instances fit in memory" in rows[name]["source"] and rows[name]["source"].startswith("estimated: ")
    for name in ("3g.71gb", "4g.71gb", "7g.141gb"):
        assert by[name].config == unchecked[name].config and by[name].infer_per_s == unchecked[name].infer_per_s
        assert by[name].memory_fit is not None and by[name].memory_fit >= by[name].config["instance_count"]
    assert rows["7g.141gb"]["source"] == "measured"

    ranked, before = rank_layouts(runs, gpu), rank_layouts(plain, gpu)
    assert not any("1g.18gb" in r.counts or "1g.18gb+me" in r.counts for r in ranked)
    assert any("1g.18gb" in r.counts for r in before)
    # Without memory, filling the 3g with 1g.18gb slices ties for second; with it, 3g + 4g is second alone.
    assert [r.label for r in ranked[:3]] == ["1x7g.141gb", "1x3g.71gb,1x4g.71gb", "2x3g.71gb"]
    assert [r.label for r in before[:3]] != [r.label for r in ranked[:3]]
    assert all(r.total_infer_per_s == pytest.approx(sum(by[p].infer_per_s * n for p, n in r.counts.items())) for r in ranked)


def test_the_cli_says_whether_instances_were_memory_checked(tmp_path: Path) -> None:
    measured = cli("mig-plan", "--gpu", "H200-141GB", "--from-tune", str(tune_run(tmp_path / "a", "whole-gpu", 12000, instances=8, gpu_mib=20 * 1024)))
    assert measured.returncode == 0, measured.stderr
    out = " ".join(measured.stdout.split())
    small = next(line for line in measured.stdout.splitlines() if line.startswith("│ 1g.18gb "))
    assert "GPU MiB/inst" in out and "does not fit:" in small and "20,480 (0)" in small  # MiB per instance (instances that fit)
    assert "the memory per instance is measured" in out and "512 MiB per server, the documented estimates" in out
    assert "not memory-checked" not in out
    old = cli("mig-plan", "--gpu", "H200-141GB", "--from-tune", str(ROOT / "scripts/results/h200-2026-12-01/tune_digits_fp32_whole-gpu.json"))
    assert old.returncode == 0, old.stderr
    out = " ".join(old.stdout.split())
    assert "GPU memory was not measured for digits_fp32" in out and "instance counts are not memory-checked" in out
    assert "GPU MiB/inst" not in out and "best measured layout 1x7g.141gb" in out
    huge = cli("mig-plan", "--gpu", "H200-141GB", "--from-tune", str(tune_run(tmp_path / "b", "whole-gpu", 100, gpu_mib=200 * 1024)))
    assert huge.returncode == 0, huge.stderr
    assert "best measured layout" not in huge.stdout and "best estimated layout" not in huge.stdout
    assert "digits_fp32: not one instance fits any profile (204,800 MiB per instance measured)" in " ".join(huge.stdout.split())
