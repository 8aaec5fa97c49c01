"""What a TensorRT plan is bound to, and the one-line refusal of a plan where it cannot load.

A plan loads only on the TensorRT version that built it (TensorRT, "Engine Compatibility": "By
default, TensorRT engines are compatible only with the version of TensorRT used to build them";
the pipeline never builds version-compatible plans, which would embed host code) and, unless built
hardware-compatible, only on GPUs of the compute capability it was built on. With the
``AMPERE_PLUS`` level it loads on any GPU of compute capability 8.0 or newer. TensorRT would fail
the load deep inside a server; this module says so first, naming the plan, the build and the target.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError

AMPERE = (8, 0)  # the oldest compute capability an AMPERE_PLUS plan runs on


@dataclass(frozen=True)
class PlanBinding:
    """The TensorRT version, GPU and hardware-compatibility level a plan was built with (from its metadata)."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: tuple[int, int]
    hardware_compatibility: str  # "NONE" | "AMPERE_PLUS"

    @classmethod
    def of(cls, metadata: Mapping[str, Any], where: str) -> PlanBinding:
        """From a plan's metadata JSON; PipelineError naming ``where`` if it does not record them."""
        try:
            gpu = metadata["gpu"]
            major, minor = (int(p) for p in str(gpu["compute_capability"]).split("."))
            return cls(str(metadata["tensorrt_version"]), str(gpu["name"]), (major, minor),
                       str(metadata.get("hardware_compatibility", "NONE")))
        except (KeyError, TypeError, ValueError):
            raise PipelineError(f"{where} does not record the TensorRT version and GPU it was built for",
                                "rebuild the plan (python -m pipeline build) so its metadata records them") from None

    def problem(self, *, tensorrt_version: str | None, compute_capability: tuple[int, int] | None, target: str) -> str | None:
        """Why this plan cannot load on ``target`` (a TensorRT version and/or GPU compute capability); None if it can."""
        if tensorrt_version is not None and not same_tensorrt(self.tensorrt_version, tensorrt_version):
            return f"built with TensorRT {self.tensorrt_version} but {target} has TensorRT {tensorrt_version} (a plan loads only on the TensorRT that built it)"
        if compute_capability is None:
            return None
        cc, have = _cc(self.compute_capability), _cc(compute_capability)
        if self.hardware_compatibility == "AMPERE_PLUS":
            if compute_capability < AMPERE:
                return f"built hardware-compatible (Ampere and newer) but {target} has a GPU of compute capability {have}"
            return None
        if compute_capability != self.compute_capability:
            return f"built for compute capability {cc} ({self.gpu_name}) but {target} has a GPU of compute capability {have}"
        return None


def same_tensorrt(built: str, target: str) -> bool:
    """Whether a plan built with TensorRT ``built`` loads on TensorRT ``target``: the same version, compared on
    as many numeric parts as both give (``"10.5"``, a release table's precision, matches ``"10.5.0.18"``)."""
    a, b = _version_parts(built), _version_parts(target)
    n = min(len(a), len(b))
    return n >= 2 and a[:n] == b[:n]


def _version_parts(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.strip().split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _cc(value: tuple[int, int]) -> str:
    return f"{value[0]}.{value[1]}"


def check_plan(name: str, metadata: Mapping[str, Any], *, tensorrt_version: str | None, compute_capability: tuple[int, int] | None,
               target: str) -> None:
    """Raise one PipelineError if plan ``name`` cannot load on ``target``."""
    binding = PlanBinding.of(metadata, f"the metadata of plan {name}")
    why = binding.problem(tensorrt_version=tensorrt_version, compute_capability=compute_capability, target=target)
    if why:
        fix = "rebuild it with the TensorRT and on the GPU it will run on (python -m pipeline build)"
        if "compute capability" in why and "hardware-compatible" not in why:
            fix += ", or with --hardware-compatible for a fleet of Ampere-or-newer GPUs"
        raise PipelineError(f"plan {name} cannot load there: {why}", fix)


def served_plan_metadata(model_dir: Path) -> dict[str, Any] | None:
    """The engine metadata the newest version of a published plan model recorded (its build report
    beside the model, see pipeline.triton.repository); None for a model without one."""
    import json

    from pipeline.data.workspace import BUILD_REPORT

    try:
        versions = json.loads((Path(model_dir) / BUILD_REPORT).read_text()).get("versions", {})
        meta = versions[max(versions, key=int)].get("engine_metadata") if versions else None
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return dict(meta) if isinstance(meta, dict) else None


def check_plan_models(plan_models: Mapping[str, Path], *, tensorrt_version: str | None, compute_capability: tuple[int, int] | None,
                      target: str) -> None:
    """Raise one PipelineError for the first published plan model (name → model folder) that cannot load on ``target``.

    A plan model without recorded metadata is refused too: nothing says where it can load."""
    for name, model_dir in sorted(plan_models.items()):
        meta = served_plan_metadata(model_dir)
        check_plan(name, meta if meta is not None else {}, tensorrt_version=tensorrt_version, compute_capability=compute_capability,
                   target=target)
