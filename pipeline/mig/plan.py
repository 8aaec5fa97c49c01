"""How many instances of each model to run on each MIG profile: memory first, then a compute cap.

Every MIG device runs one tritonserver that loads every model planned for its profile, so the
models on a slice share its memory:

    budget = slice memory × (1 − HEADROOM_FRACTION) − PROCESS_OVERHEAD_BYTES
    Σ_models (shared + instances × per_instance) ≤ budget

Compute heuristic: a model gets at most ``max(1, SMs // SMS_PER_INSTANCE)`` instances on a slice.
With ``SMS_PER_INSTANCE = 8`` a 1g slice (14 SMs on A100, 16 on H100/H200) runs 1–2 instances,
2g 3–4, 3g 5–7, 7g 12–16. Why: extra instances only help while one instance's kernels leave SMs
idle (small-batch inference of small models keeps a few SMs busy per kernel); they overlap one
request's copies and host work with another's kernels. Past ~8 SMs per instance they mostly
time-slice, adding latency and memory without throughput. The cap is per model, because
typically one model variant carries the traffic of a slice. Measure with the load test and
override the count in configs/<profile>.pbtxt if a model is compute-heavy.

If the memory limit binds, the planner lowers the model with the most instances first; a model
that cannot fit even one instance on a profile is excluded from it with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.core.errors import PipelineError
from pipeline.mig.layout import Layout
from pipeline.mig.memory import (
    HEADROOM_FRACTION,
    MIB,
    PROCESS_OVERHEAD_BYTES,
    MemoryEstimate,
)
from pipeline.mig.profiles import GpuMig, MigProfile

SMS_PER_INSTANCE = 8
GIB = 1 << 30

HEURISTIC = (
    f"instances per model ≤ max(1, SMs // {SMS_PER_INSTANCE}) (a 1g slice runs 1–2), and all models "
    f"on a slice fit in its memory × {1 - HEADROOM_FRACTION:.0%} − {PROCESS_OVERHEAD_BYTES // MIB} MiB "
    "server overhead (CUDA context + Triton pool)"
)


@dataclass(frozen=True)
class ModelOnProfile:
    """One model on one profile: its instance count (0 = excluded) and why."""

    model: str
    instances: int
    compute_limit: int
    memory_limit: int  # instances that fit if the model were alone on the slice
    bytes_used: int
    reason: str


@dataclass(frozen=True)
class ProfilePlan:
    """The models one tritonserver on a device of ``profile`` loads."""

    profile: MigProfile
    devices: int  # devices of this profile in the layout (0 when planning without a layout)
    budget_bytes: int
    models: tuple[ModelOnProfile, ...]
    # (model, the model it rides with): a raw-input ensemble and its CPU step take no slice of their own and load
    # wherever the variant they serve loads
    riders: tuple[tuple[str, str], ...] = ()

    @property
    def used_bytes(self) -> int:
        return sum(m.bytes_used for m in self.models)

    @property
    def loaded(self) -> tuple[str, ...]:
        """Models with at least one instance on this profile, and the riders of those."""
        own = tuple(m.model for m in self.models if m.instances > 0)
        return own + tuple(rider for rider, anchor in self.riders if anchor in own)

    def instances(self, model: str) -> int:
        """Instances of ``model`` on this profile (0 if excluded or unknown)."""
        return next((m.instances for m in self.models if m.model == model), 0)


@dataclass(frozen=True)
class MigPlan:
    """Instances per model per MIG profile for one GPU (and layout, when one was given)."""

    gpu: GpuMig
    layout: Layout | None
    profiles: tuple[ProfilePlan, ...]
    memory: Mapping[str, MemoryEstimate]

    def profile(self, name: str) -> ProfilePlan:
        for p in self.profiles:
            if p.profile.name == name:
                return p
        raise PipelineError(f"the plan has no profile '{name}'", f"planned: {', '.join(p.profile.name for p in self.profiles)}")

    @property
    def exclusions(self) -> list[tuple[str, str, str]]:
        """(profile, model, reason) for every model left off a profile."""
        return [(p.profile.name, m.model, m.reason) for p in self.profiles for m in p.models if m.instances == 0]


def compute_limit(profile: MigProfile) -> int:
    """The compute cap: ``max(1, SMs // SMS_PER_INSTANCE)``."""
    return max(1, profile.sm_count // SMS_PER_INSTANCE)


def budget_bytes(profile: MigProfile) -> int:
    """Bytes the models on one device of ``profile`` may use together."""
    return int(profile.memory_bytes * (1 - HEADROOM_FRACTION)) - PROCESS_OVERHEAD_BYTES


def plan_profile(profile: MigProfile, memory: Mapping[str, MemoryEstimate], devices: int = 0) -> ProfilePlan:
    """Instances of each model on one device of ``profile``."""
    budget = budget_bytes(profile)
    cap = compute_limit(profile)
    counts: dict[str, int] = {}
    limits: dict[str, int] = {}
    reasons: dict[str, str] = {}
    for name, est in memory.items():
        if est.per_instance_bytes <= 0:
            raise PipelineError(f"memory estimate for '{name}' is {est.per_instance_bytes} bytes per instance")
        fit = max(0, (budget - est.shared_bytes) // est.per_instance_bytes)
        limits[name] = int(fit)
        if fit == 0:
            reasons[name] = (
                f"too large for {profile.name}: one instance needs {est.bytes_for(1) / GIB:.2f} GiB, the "
                f"slice has {max(budget, 0) / GIB:.2f} GiB for models ({profile.memory_gib:.2f} GiB "
                f"− {HEADROOM_FRACTION:.0%} headroom − {PROCESS_OVERHEAD_BYTES // MIB} MiB server)"
            )
            counts[name] = 0
        else:
            counts[name] = min(cap, int(fit))
            reasons[name] = (
                f"compute: {profile.sm_count} SMs // {SMS_PER_INSTANCE}" if cap <= fit else f"memory: {fit} fit"
            )

    initial = dict(counts)
    initial_reasons = dict(reasons)

    def used() -> int:
        return sum(memory[n].bytes_for(c) for n, c in counts.items() if c > 0)

    while used() > budget:
        many = [n for n, c in counts.items() if c > 1]
        if many:
            name = max(many, key=lambda n: (counts[n], memory[n].per_instance_bytes, n))
            counts[name] -= 1
            reasons[name] = "memory: shares the slice with the other models"
            continue
        # One instance each still does not fit: leave the largest model off and start the
        # reductions again from the compute/memory counts of the models that remain.
        name = max((n for n, c in counts.items() if c > 0), key=lambda n: (memory[n].bytes_for(1), n))
        for other, count in counts.items():
            if count > 0 and other != name:
                counts[other], reasons[other] = initial[other], initial_reasons[other]
        counts[name] = 0
        reasons[name] = f"does not fit beside the other models on {profile.name}"
    models = tuple(
        ModelOnProfile(
            model=name,
            instances=counts[name],
            compute_limit=cap,
            memory_limit=limits[name],
            bytes_used=memory[name].bytes_for(counts[name]) if counts[name] else 0,
            reason=reasons[name],
        )
        for name in memory
    )
    return ProfilePlan(profile=profile, devices=devices, budget_bytes=budget, models=models)


def plan_instances(gpu: GpuMig, memory: Mapping[str, MemoryEstimate], layout: Layout | None = None) -> MigPlan:
    """Plan every profile of ``layout`` (or, without one, every profile of ``gpu``)."""
    if not memory:
        raise PipelineError("there is no model to plan", "pass --onnx, --engine-metadata or --repository")
    if layout is None:
        profiles = [(p, 0) for p in gpu.profiles]
    else:
        profiles = [(gpu.profile(name), n) for name, n in layout.counts().items()]
    return MigPlan(
        gpu=gpu,
        layout=layout,
        profiles=tuple(plan_profile(p, memory, n) for p, n in profiles),
        memory=dict(memory),
    )


def with_riders(plan: MigPlan, riders: dict[str, str]) -> MigPlan:
    """``plan`` with ``riders`` (model → the model it rides with) loaded on every profile that loads their anchor."""
    from dataclasses import replace

    return replace(plan, profiles=tuple(replace(p, riders=tuple(sorted(riders.items()))) for p in plan.profiles))
