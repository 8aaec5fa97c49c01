"""MIG layouts (``3x2g.35gb,1x1g.18gb``): parsing and checking that the GPU can hold them.

A layout fits when (1) no profile is used more often than its "Instances Total", (2) the
compute slices add up to at most 7 and the memory slices to at most 8, and (3) every GPU
instance gets a placement from ``nvidia-smi mig -lgipp`` without two of them overlapping on the
memory-slice axis (a small exact search; at most 7 instances).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from pipeline.core.errors import PipelineError
from pipeline.mig.profiles import COMPUTE_SLICES, MEMORY_SLICES, GpuMig, MigProfile

_ITEM = re.compile(r"^(?:(?P<count>\d+)\s*[x*×]\s*)?(?P<profile>\d+g\.\d+gb(?:\+\w+)?)$", re.IGNORECASE)


@dataclass(frozen=True)
class Layout:
    """The GPU instances to create, in order: one entry per MIG device."""

    gpu: GpuMig
    slices: tuple[MigProfile, ...]
    placements: tuple[int, ...]  # start memory slice of each entry of ``slices``

    def counts(self) -> dict[str, int]:
        """Profile name → how many devices of it, in first-seen order."""
        return dict(Counter(p.name for p in self.slices))

    def __str__(self) -> str:
        return ",".join(f"{n}x{name}" for name, n in self.counts().items())


def parse_layout(text: str, gpu: GpuMig) -> Layout:
    """Parse ``"3x2g.35gb,1x1g.18gb"`` (``N x`` optional) and check it fits ``gpu``."""
    slices: list[MigProfile] = []
    for raw in text.split(","):
        item = raw.strip()
        m = _ITEM.match(item)
        if m is None:
            raise PipelineError(
                f"layout entry '{item}' is not COUNTxPROFILE",
                "write the layout like 3x2g.35gb,1x1g.18gb",
            )
        count = int(m["count"] or 1)
        if count < 1:
            raise PipelineError(f"layout entry '{item}' asks for {count} instances", "use a count of 1 or more")
        slices.extend([gpu.profile(m["profile"])] * count)
    return layout_of(slices, gpu)


def layout_of(slices: list[MigProfile] | tuple[MigProfile, ...], gpu: GpuMig) -> Layout:
    """Check that ``slices`` can exist together on ``gpu`` and find placements for them."""
    if not slices:
        raise PipelineError("the MIG layout is empty", "name at least one profile, e.g. 7x1g.18gb")
    for name, n in Counter(p.name for p in slices).items():
        profile = gpu.profile(name)
        if n > profile.max_instances:
            raise PipelineError(
                f"the layout asks for {n} × {name} but {gpu.name} allows at most "
                f"{profile.max_instances} of that profile",
                f"use at most {profile.max_instances}x{name}",
            )
    compute = sum(p.compute_slices for p in slices)
    if compute > COMPUTE_SLICES:
        raise PipelineError(
            f"the layout needs {compute} compute slices but {gpu.name} has {COMPUTE_SLICES}",
            "drop or shrink instances until the 'Ng' parts add up to 7 or less",
        )
    memory = sum(p.memory_slices for p in slices)
    if memory > MEMORY_SLICES:
        raise PipelineError(
            f"the layout needs {memory} memory slices but {gpu.name} has {MEMORY_SLICES}",
            "use fewer large-memory profiles (1g.*, 2g.* use 1-2 slices, 3g/4g use 4, 7g uses 8)",
        )
    # Larger instances first: fewer choices, so the search fails fast when nothing fits.
    order = sorted(range(len(slices)), key=lambda i: (-slices[i].memory_slices, i))
    found = _place([slices[i] for i in order], 0)
    if found is None:
        raise PipelineError(
            f"no valid placement for {_describe(slices)} on {gpu.name}: the instances overlap on the "
            "memory slices (placements per `nvidia-smi mig -lgipp`)",
            "choose another combination, e.g. one listed in the MIG User Guide's supported "
            "configurations",
        )
    starts = [0] * len(slices)
    for position, i in enumerate(order):
        starts[i] = found[position]
    return Layout(gpu=gpu, slices=tuple(slices), placements=tuple(starts))


def _place(todo: list[MigProfile], used: int) -> list[int] | None:
    if not todo:
        return []
    head, rest = todo[0], todo[1:]
    for start in head.placements:
        mask = ((1 << head.memory_slices) - 1) << start
        if start + head.memory_slices <= MEMORY_SLICES and not used & mask:
            tail = _place(rest, used | mask)
            if tail is not None:
                return [start] + tail
    return None


def _describe(slices: list[MigProfile] | tuple[MigProfile, ...]) -> str:
    return ",".join(f"{n}x{name}" for name, n in Counter(p.name for p in slices).items())


def layout_from_devices(profiles: list[str], gpu: GpuMig) -> Layout:
    """The layout of MIG devices that already exist (profile names from ``nvidia-smi -L``)."""
    return layout_of([gpu.profile(p) for p in profiles], gpu)
