"""Instances per profile: the compute cap for a small model, exclusions for a large one, sharing."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.mig.layout import parse_layout
from pipeline.mig.memory import (
    MemoryEstimate,
    memory_from_engine_metadata,
    memory_from_onnx,
)
from pipeline.mig.plan import (
    GIB,
    budget_bytes,
    compute_limit,
    plan_instances,
    plan_profile,
)
from pipeline.mig.profiles import builtin_gpu

H200 = builtin_gpu("H200-141GB")


def test_small_model_is_capped_by_compute_on_every_h200_profile(tiny_onnx: Path) -> None:
    plan = plan_instances(H200, {"tiny": memory_from_onnx(tiny_onnx, 32)})
    counts = {p.profile.name: p.instances("tiny") for p in plan.profiles}
    # SMs 16, 16, 26, 32, 60, 64, 132 // 8
    assert counts == {"1g.18gb": 2, "1g.18gb+me": 2, "1g.35gb": 3, "2g.35gb": 4, "3g.71gb": 7, "4g.71gb": 8, "7g.141gb": 16}
    assert all(m.reason.startswith("compute:") for p in plan.profiles for m in p.models)
    assert plan.exclusions == []
    assert all(p.devices == 0 for p in plan.profiles)  # no layout: every profile, for reference


def test_a100_1g_slice_runs_one_instance(tiny_onnx: Path) -> None:
    a100 = builtin_gpu("A100-40GB")
    assert compute_limit(a100.profile("1g.5gb")) == 1  # 14 SMs
    plan = plan_instances(a100, {"tiny": memory_from_onnx(tiny_onnx, 8)}, parse_layout("7x1g.5gb", a100))
    assert [(p.profile.name, p.devices, p.instances("tiny")) for p in plan.profiles] == [("1g.5gb", 7, 1)]


def test_model_too_large_for_1g_slices_is_excluded_there(tmp_path: Path) -> None:
    """A 20 GiB-activation engine (metadata written by hand: TensorRT cannot run here)."""
    meta = tmp_path / "big.plan.json"
    meta.write_text(json.dumps({"device_memory_bytes": 20 * GIB, "weights_bytes": 2 * GIB}))
    plan = plan_instances(H200, {"big": memory_from_engine_metadata(meta)})
    counts = {p.profile.name: p.instances("big") for p in plan.profiles}
    # budgets: 1g.18gb 13.9 GiB, 1g.35gb/2g 28.75, 3g/4g 62.275, 7g 125.5; need 2 + n × 20.0625
    assert counts == {"1g.18gb": 0, "1g.18gb+me": 0, "1g.35gb": 1, "2g.35gb": 1, "3g.71gb": 3, "4g.71gb": 3, "7g.141gb": 6}
    excluded = {(p, m) for p, m, _ in plan.exclusions}
    assert excluded == {("1g.18gb", "big"), ("1g.18gb+me", "big")}
    reason = plan.exclusions[0][2]
    assert "too large for 1g.18gb" in reason and "22.06 GiB" in reason and "13.90 GiB" in reason
    three = plan.profile("3g.71gb").models[0]
    assert three.reason == "memory: 3 fit" and three.compute_limit == 7
    assert plan.profile("1g.18gb").used_bytes == 0


def test_models_on_one_slice_share_its_memory() -> None:
    profile = H200.profile("1g.18gb")  # budget 13.9 GiB, compute cap 2
    memory = {
        "a": MemoryEstimate("test", 0, 5 * GIB),
        "b": MemoryEstimate("test", 0, 4 * GIB),
    }
    plan = plan_profile(profile, memory)
    assert budget_bytes(profile) == int(16 * GIB * 0.9) - 512 * (1 << 20)
    # 2 + 2 instances need 18 GiB: the model with the most (ties: the larger) gives one up
    assert (plan.instances("a"), plan.instances("b")) == (1, 2)
    assert plan.used_bytes == 13 * GIB <= plan.budget_bytes
    assert plan.loaded == ("a", "b")
    # three models that fit alone but not together: the largest is left off
    crowded = plan_profile(profile, {**memory, "c": MemoryEstimate("test", 0, 6 * GIB)})
    assert (crowded.instances("a"), crowded.instances("b"), crowded.instances("c")) == (1, 2, 0)
    assert "does not fit beside the other models" in crowded.models[2].reason


def test_plan_with_layout_covers_only_its_profiles(tiny_onnx: Path) -> None:
    plan = plan_instances(H200, {"tiny": memory_from_onnx(tiny_onnx, 8)}, parse_layout("3x2g.35gb,1x1g.18gb", H200))
    assert [(p.profile.name, p.devices, p.instances("tiny")) for p in plan.profiles] == [
        ("2g.35gb", 3, 4),
        ("1g.18gb", 1, 2),
    ]
