"""Built-in MIG profile tables for the GPUs the planner knows.

Sources (cited, not copied):

- NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"
  (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html):
  profile names, fractions of memory/SMs and the number of instances of each profile.
  A100-SXM4-80GB uses the A100-40GB table with doubled memory in the names.
- The same guide, "Getting Started with MIG" → "List GPU Instance Profiles"
  (`nvidia-smi mig -lgip`, `nvidia-smi mig -lgipp`): profile IDs, memory in GiB, SM counts and
  placements ``{starts}:size`` on the 8 memory slices. Published ``-lgipp`` listings for A100,
  H100 SXM and H100 NVL are identical: IDs 19/20 {0..6}:1, 15 {0,2,4,6}:2, 14 {0,2,4}:2,
  9 {0,4}:4, 5 {0}:4, 0 {0}:8. H200 uses the same profile IDs; its placements are assumed to be
  the same (the H200 recording has no ``-lgipp``).
- A100-80GB and H100-80GB (SXM5): GiB and SM counts as ``nvidia-smi mig -lgip`` prints them on
  those GPUs (the guide's example output is A100-40GB; the 80 GB listings are the GPU Operator
  documentation's A100-80GB example and public H100-SXM5 recordings).
- H200-141GB: the values recorded on a real H200 (driver 580.159.04) in
  ``shared/fixtures/nvidia-smi-mig-lgip-h200.txt``; a test checks this table against it.

The memory column is what ``nvidia-smi mig -lgip`` reports (usable GiB), not the number in the
profile name: 1g.18gb has 16.00 GiB. Drivers round it differently (A100-40GB 1g.10gb shows 9.62
or 9.75); give the planner a recorded ``-lgip`` (``--from-nvidia-smi``) to use exact numbers.
H100 NVL / H100 PCIe 94GB (1g.12gb … 7g.94gb) differ from H100-80GB and are not built in; pass
their ``-lgip`` output instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.errors import PipelineError

COMPUTE_SLICES = 7  # GPCs usable by MIG on A100/H100/H200
MEMORY_SLICES = 8


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile: ``1g.18gb`` with its size and where it may be placed."""

    name: str  # as nvidia-smi prints it, without the "MIG " prefix: "1g.18gb", "1g.18gb+me"
    profile_id: int
    memory_gib: float  # usable memory reported by nvidia-smi mig -lgip
    sm_count: int
    max_instances: int
    compute_slices: int  # the "Ng" in the name
    memory_slices: int  # of MEMORY_SLICES
    placements: tuple[int, ...]  # valid start indices on the memory-slice axis

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * (1 << 30))

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")


@dataclass(frozen=True)
class GpuMig:
    """A MIG-capable GPU and its profiles, smallest first."""

    name: str  # "H200-141GB"
    profiles: tuple[MigProfile, ...]
    source: str  # where the numbers come from
    compute_capability: tuple[int, int] | None = None  # what a plan must be built for; None: not known (nvidia-smi -lgip)

    def profile(self, name: str) -> MigProfile:
        """The profile called ``name`` (``"MIG 1g.18gb"`` and ``"1g.18gb"`` both work)."""
        key = name.strip().removeprefix("MIG ").strip().lower()
        for p in self.profiles:
            if p.name.lower() == key:
                return p
        raise PipelineError(
            f"MIG profile '{name}' does not exist on {self.name}",
            f"use one of: {', '.join(p.name for p in self.profiles)}",
        )


# Placements on the memory-slice axis by profile ID, from `nvidia-smi mig -lgipp` (see above).
PLACEMENTS_BY_ID: dict[int, tuple[int, ...]] = {
    19: (0, 1, 2, 3, 4, 5, 6),
    20: (0, 1, 2, 3, 4, 5, 6),
    15: (0, 2, 4, 6),
    14: (0, 2, 4),
    9: (0, 4),
    5: (0,),
    0: (0,),
}
MEMORY_SLICES_BY_ID: dict[int, int] = {19: 1, 20: 1, 15: 2, 14: 2, 9: 4, 5: 4, 0: 8}


def compute_slices_of(name: str) -> int:
    """The compute slices of a profile name: ``"3g.71gb"`` → 3."""
    head = name.removeprefix("MIG ").split(".", 1)[0]
    if not head.endswith("g") or not head[:-1].isdigit():
        raise PipelineError(f"'{name}' is not a MIG profile name (expected e.g. 1g.18gb)")
    return int(head[:-1])


def _p(name: str, profile_id: int, memory_gib: float, sms: int, max_instances: int) -> MigProfile:
    return MigProfile(
        name=name,
        profile_id=profile_id,
        memory_gib=memory_gib,
        sm_count=sms,
        max_instances=max_instances,
        compute_slices=compute_slices_of(name),
        memory_slices=MEMORY_SLICES_BY_ID[profile_id],
        placements=PLACEMENTS_BY_ID[profile_id],
    )


_GUIDE = "NVIDIA MIG User Guide (supported profiles; nvidia-smi mig -lgip example)"
# Compute capabilities: NVIDIA's CUDA GPUs list (developer.nvidia.com/cuda-gpus): A100 8.0, H100 and H200 9.0.

BUILTIN_GPUS: dict[str, GpuMig] = {
    g.name: g
    for g in (
        GpuMig(
            "A100-40GB",
            (
                _p("1g.5gb", 19, 4.75, 14, 7),
                _p("1g.5gb+me", 20, 4.75, 14, 1),
                _p("1g.10gb", 15, 9.62, 14, 4),
                _p("2g.10gb", 14, 9.62, 28, 3),
                _p("3g.20gb", 9, 19.50, 42, 2),
                _p("4g.20gb", 5, 19.50, 56, 1),
                _p("7g.40gb", 0, 39.25, 98, 1),
            ),
            _GUIDE,
            (8, 0),
        ),
        GpuMig(
            "A100-80GB",
            (
                _p("1g.10gb", 19, 9.50, 14, 7),
                _p("1g.10gb+me", 20, 9.50, 14, 1),
                _p("1g.20gb", 15, 19.50, 14, 4),
                _p("2g.20gb", 14, 19.50, 28, 3),
                _p("3g.40gb", 9, 39.25, 42, 2),
                _p("4g.40gb", 5, 39.25, 56, 1),
                _p("7g.80gb", 0, 79.00, 98, 1),
            ),
            _GUIDE,
            (8, 0),
        ),
        GpuMig(
            "H100-80GB",
            (
                _p("1g.10gb", 19, 9.75, 16, 7),
                _p("1g.10gb+me", 20, 9.75, 16, 1),
                _p("1g.20gb", 15, 19.62, 26, 4),
                _p("2g.20gb", 14, 19.62, 32, 3),
                _p("3g.40gb", 9, 39.50, 60, 2),
                _p("4g.40gb", 5, 39.50, 64, 1),
                _p("7g.80gb", 0, 79.25, 132, 1),
            ),
            _GUIDE + "; H100-SXM5-80GB",
            (9, 0),
        ),
        GpuMig(
            "H200-141GB",
            (
                _p("1g.18gb", 19, 16.00, 16, 7),
                _p("1g.18gb+me", 20, 16.00, 16, 1),
                _p("1g.35gb", 15, 32.50, 26, 4),
                _p("2g.35gb", 14, 32.50, 32, 3),
                _p("3g.71gb", 9, 69.75, 60, 2),
                _p("4g.71gb", 5, 69.75, 64, 1),
                _p("7g.141gb", 0, 140.00, 132, 1),
            ),
            "nvidia-smi mig -lgip on an H200 (driver 580.159.04)",
            (9, 0),
        ),
    )
}


def builtin_gpu(name: str) -> GpuMig:
    """The built-in table for ``name`` (case-insensitive: ``h200-141gb`` works)."""
    for key, gpu in BUILTIN_GPUS.items():
        if key.lower() == name.strip().lower():
            return gpu
    raise PipelineError(
        f"no built-in MIG table for GPU '{name}'",
        f"use one of {', '.join(BUILTIN_GPUS)}, or pass the GPU's `nvidia-smi mig -lgip` output "
        "with --from-nvidia-smi",
    )
