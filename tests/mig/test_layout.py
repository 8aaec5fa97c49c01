"""MIG layouts: parsing, and every way a layout can fail to fit (counts, slices, placements)."""

from __future__ import annotations

import pytest

from pipeline.core.errors import PipelineError
from pipeline.mig.layout import layout_from_devices, layout_of, parse_layout
from pipeline.mig.profiles import GpuMig, MigProfile, builtin_gpu

H200 = builtin_gpu("H200-141GB")


def test_parse_valid_layouts_and_placements() -> None:
    layout = parse_layout("3x2g.35gb,1x1g.18gb", H200)
    assert [p.name for p in layout.slices] == ["2g.35gb"] * 3 + ["1g.18gb"]
    assert layout.counts() == {"2g.35gb": 3, "1g.18gb": 1}
    assert str(layout) == "3x2g.35gb,1x1g.18gb"
    assert sorted(layout.placements) == [0, 2, 4, 6]
    assert parse_layout("7x1g.18gb", H200).placements == (0, 1, 2, 3, 4, 5, 6)
    # 4g can only start at 0, so the 3g must take the upper half
    four_three = parse_layout("3g.71gb, 4g.71gb", H200)
    assert four_three.placements == (4, 0)
    assert parse_layout("1x1g.18gb+me,6x1g.18gb", H200).counts() == {"1g.18gb+me": 1, "1g.18gb": 6}


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("3x3g.71gb", "at most 2 of that profile"),
        ("8x1g.18gb", "at most 7"),
        ("2x1g.18gb+me", "at most 1"),
        ("2x3g.71gb,1x2g.35gb", "needs 8 compute slices but H200-141GB has 7"),
        ("1x3g.71gb,1x2g.35gb,1x1g.35gb,1x1g.18gb", "needs 9 memory slices"),
        ("1x1g.10gb", "does not exist on H200-141GB"),
        ("three 2g.35gb", "is not COUNTxPROFILE"),
        ("0x2g.35gb", "asks for 0"),
    ],
)
def test_layouts_that_do_not_fit(layout: str, message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        parse_layout(layout, H200)


def test_overlapping_placements_are_refused() -> None:
    """Counts and slice totals can pass while placements overlap (synthetic table: the built-in
    ones have no such combination up to 7 instances, so the search is tested on its own)."""
    odd = MigProfile("2g.20gb", 14, 19.5, 28, 3, compute_slices=2, memory_slices=2, placements=(0, 2))
    small = MigProfile("1g.10gb", 19, 9.5, 14, 7, compute_slices=1, memory_slices=1, placements=(0, 1, 2))
    gpu = GpuMig("synthetic", (small, odd), "test")
    assert layout_of([odd, small], gpu).placements == (0, 2)
    with pytest.raises(PipelineError, match="no valid placement"):
        layout_of([odd, odd, small], gpu)


def test_layout_from_existing_devices() -> None:
    layout = layout_from_devices(["2g.35gb", "2g.35gb", "2g.35gb", "1g.18gb"], H200)
    assert layout.counts() == {"2g.35gb": 3, "1g.18gb": 1}
    with pytest.raises(PipelineError, match="empty"):
        layout_from_devices([], H200)
