"""Per-profile Triton configs: ``<model>/configs/<profile>.pbtxt`` beside ``config.pbtxt``.

Triton's custom model configuration: ``tritonserver --model-config-name=<name>`` loads
``<model>/configs/<name>.pbtxt`` for every model that has it, and silently falls back to
``config.pbtxt`` for models that do not (Triton user guide, "Custom Model Configuration"; core
``GetModelConfigFullPath`` joins ``configs/`` + name + ``.pbtxt``). The only documented rule for the
name is "no space character"; it is used as a file name, so ``/`` is refused too. Dots and ``+``
work (``1g.18gb``, ``1g.18gb+me``), so the config name is the MIG profile name unchanged — what
``nvidia-smi -L`` prints for the device is exactly the ``--model-config-name`` to pass.

Because of the silent fallback, servers are started with ``--model-control-mode=explicit`` and
``--load-model`` for exactly the models that have a config for their profile (see bundle.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.atomic import write_bytes_atomic
from pipeline.core.errors import PipelineError, require
from pipeline.mig.layout import parse_layout
from pipeline.mig.memory import MemoryEstimate
from pipeline.mig.plan import MigPlan, plan_instances
from pipeline.mig.profiles import GpuMig, builtin_gpu
from pipeline.triton.config import config_text

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

CONFIGS_DIR = "configs"


def config_name(profile: str) -> str:
    """The ``--model-config-name`` for a MIG profile: the profile name itself, checked."""
    require(bool(profile) and not any(c.isspace() for c in profile), f"config name '{profile}' contains a space",
            "Triton config names may not contain spaces")
    require("/" not in profile and profile not in (".", ".."), f"config name '{profile}' is not a file name")
    return profile


def config_relpath(profile: str) -> str:
    """``configs/<profile>.pbtxt``, relative to the model directory."""
    return f"{CONFIGS_DIR}/{config_name(profile)}.pbtxt"


def profile_configs(base: ModelConfig, plan: MigPlan, model: str | None = None) -> dict[str, ModelConfig]:
    """One config per profile the model runs on: the base config with its own GPU instance group.

    Keys are paths relative to the model directory (``"configs/1g.18gb.pbtxt"``). Profiles the
    plan excluded the model from get no file (the bundle does not load the model there).
    """
    from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelInstanceGroup

    name = model or base.name
    require(bool(name), "the base ModelConfig has no name", "set ModelConfig.name or pass model=")
    require(name in plan.memory, f"model '{name}' is not in the MIG plan", f"planned models: {', '.join(plan.memory)}")
    out: dict[str, ModelConfig] = {}
    for profile_plan in plan.profiles:
        count = profile_plan.instances(name)
        if count == 0:
            continue
        config = ModelConfig()
        config.CopyFrom(base)
        profiles = [p for g in base.instance_group for p in g.profile]  # a plan's profiles: every one stays served
        del config.instance_group[:]
        # KIND_GPU: inside the server the MIG device is the only visible GPU (CUDA_VISIBLE_DEVICES).
        config.instance_group.add(kind=ModelInstanceGroup.Kind.KIND_GPU, count=count, profile=list(dict.fromkeys(profiles)))
        out[config_relpath(profile_plan.profile.name)] = config
    return out


def mig_configs_for_repository(
    base_configs: Mapping[str, ModelConfig],
    gpu: str | GpuMig,
    layout: str | None,
    memory: Mapping[str, MemoryEstimate],
) -> tuple[MigPlan, dict[str, dict[str, bytes]]]:
    """For the build: plan ``base_configs`` on ``gpu`` (and ``layout``) and return the extra files.

    Returns the plan and, per model name, ``{"configs/<profile>.pbtxt": text as bytes}`` — the
    ``extra_files`` of ``pipeline.triton.repository.publish_repository``, written after the model
    file and config.pbtxt. ``memory`` must have an estimate for every model
    (``memory_from_onnx`` / ``memory_from_engine_metadata`` / ``memory_from_metadata``).
    """
    missing = sorted(set(base_configs) - set(memory))
    require(not missing, f"no memory estimate for model(s) {', '.join(missing)}",
            "estimate each with memory_from_onnx or memory_from_engine_metadata")
    gpu_table = builtin_gpu(gpu) if isinstance(gpu, str) else gpu
    parsed = parse_layout(layout, gpu_table) if layout else None
    plan = plan_instances(gpu_table, {name: memory[name] for name in base_configs}, parsed)
    files = {
        name: {path: config_text(cfg).encode() for path, cfg in profile_configs(base, plan, name).items()}
        for name, base in base_configs.items()
    }
    if not any(files.values()):
        raise PipelineError(
            f"no model fits any MIG profile planned on {gpu_table.name}: "
            + "; ".join(f"{m} on {p}: {r}" for p, m, r in plan.exclusions[:3]),
            "use larger profiles in the layout, a smaller max batch, or a lower precision",
        )
    return plan, files


def write_profile_configs(model_dir: Path, files: Mapping[str, str | bytes]) -> list[Path]:
    """Write ``configs/<profile>.pbtxt`` files into an existing model directory."""
    require((Path(model_dir) / "config.pbtxt").is_file(), f"{model_dir} has no config.pbtxt",
            "write the model file and config.pbtxt before the per-profile configs")
    written = []
    for relpath, text in files.items():
        written.append(write_bytes_atomic(Path(model_dir) / relpath, text.encode() if isinstance(text, str) else text))
    return written
