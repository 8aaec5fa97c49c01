"""Built-in MIG tables: internal consistency, and the H200 table against the real H200 recording."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.mig.nvidia_smi import gpu_from_lgip, parse_lgip
from pipeline.mig.profiles import (
    BUILTIN_GPUS,
    COMPUTE_SLICES,
    MEMORY_SLICES,
    builtin_gpu,
)


@pytest.mark.parametrize("name", sorted(BUILTIN_GPUS))
def test_builtin_table_is_consistent(name: str) -> None:
    gpu = BUILTIN_GPUS[name]
    assert [p.profile_id for p in gpu.profiles] == [19, 20, 15, 14, 9, 5, 0]
    full = gpu.profiles[-1]
    assert full.name.startswith("7g.") and full.compute_slices == COMPUTE_SLICES
    assert full.memory_slices == MEMORY_SLICES and full.max_instances == 1
    smallest = gpu.profiles[0]
    assert smallest.max_instances == 7 and smallest.compute_slices == 1 and smallest.memory_slices == 1
    me = gpu.profiles[1]
    assert me.media_extensions and me.max_instances == 1 and me.memory_gib == smallest.memory_gib
    for p in gpu.profiles:
        assert p.name.split(".")[0] == f"{p.compute_slices}g"
        # every placement fits on the memory axis, and there are enough of them for max_instances
        assert all(start + p.memory_slices <= MEMORY_SLICES for start in p.placements)
        assert len(p.placements) >= p.max_instances
        assert 0 < p.memory_gib <= full.memory_gib and 0 < p.sm_count <= full.sm_count
    assert [p.memory_gib for p in gpu.profiles] == sorted(p.memory_gib for p in gpu.profiles)


def test_sm_counts_per_architecture() -> None:
    """GA100 MIG exposes 98 SMs (14 per GPC); GH100 132 (16 per 1g slice)."""
    assert builtin_gpu("A100-40GB").profile("7g.40gb").sm_count == 98
    assert builtin_gpu("A100-80GB").profile("1g.10gb").sm_count == 14
    assert builtin_gpu("H100-80GB").profile("7g.80gb").sm_count == 132
    assert builtin_gpu("H100-80GB").profile("1g.10gb").sm_count == 16


def test_builtin_h200_table_matches_the_recorded_lgip(fixtures_dir: Path) -> None:
    """The fixture is truth: every number of every profile must equal the recording."""
    recorded = gpu_from_lgip(parse_lgip((fixtures_dir / "nvidia-smi-mig-lgip-h200.txt").read_text()), "H200-141GB")
    assert recorded.profiles == BUILTIN_GPUS["H200-141GB"].profiles
    assert recorded.profile("1g.18gb").memory_gib == 16.00  # not the 18 of its name


def test_lookup_is_case_insensitive_and_errors_name_the_choices() -> None:
    assert builtin_gpu("h200-141gb").name == "H200-141GB"
    assert builtin_gpu("H200-141GB").profile("MIG 3g.71gb").profile_id == 9
    with pytest.raises(PipelineError, match="H100-80GB"):
        builtin_gpu("H100-94GB")
    with pytest.raises(PipelineError, match="1g.18gb, 1g.18gb\\+me"):
        builtin_gpu("H200-141GB").profile("1g.10gb")
