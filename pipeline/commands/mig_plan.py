"""``python -m pipeline mig-plan``: instances per MIG slice, per-profile configs, deployment bundle."""

from __future__ import annotations

import argparse
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError, require
from pipeline.core.objectstore import S3Url, repository_from_text
from pipeline.core.options import add_options, at_least, checked_config, option
from pipeline.mig import nvidia_smi
from pipeline.mig.bundle import LAUNCH_SCRIPT, write_bundle
from pipeline.mig.configs import profile_configs, write_profile_configs
from pipeline.mig.layout import Layout, layout_from_devices, parse_layout
from pipeline.mig.memory import (
    MemoryEstimate,
    memory_for_model_dir,
    memory_from_engine_metadata,
    memory_from_onnx,
)
from pipeline.mig.plan import GIB, HEURISTIC, MigPlan, plan_instances
from pipeline.mig.profiles import BUILTIN_GPUS, GpuMig, builtin_gpu
from pipeline.mig.servers import BundleSettings
from pipeline.triton.config import config_text
from pipeline.triton.repository import read_repository

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MigPlanConfig:
    """Every ``mig-plan`` option."""

    gpu: str | None = option(None, "GPU table to use, e.g. H200-141GB (or give a --query-gpu CSV)")
    layout: str | None = option(None, "MIG devices to create, e.g. 3x2g.35gb,1x1g.18gb (default: every profile)")
    from_nvidia_smi: tuple[Path, ...] = option((), "saved nvidia-smi output (-lgip, -L or --query-gpu CSV); repeatable", metavar="FILE")
    onnx: Path | None = option(None, "ONNX model: memory = weights + activations at --max-batch")
    engine_metadata: Path | None = option(None, "TensorRT engine metadata JSON (device memory, weights)")
    # Not the shared repository_option: here the repository is one of the model sources, so "not given" must be seen.
    repository: Path | S3Url | None = option(None, "Triton model repository (a folder or s3://BUCKET/PREFIX): plan every model in it",
                                             metavar="DIR|URL", parse=repository_from_text)
    max_batch: int | None = option(None, "batch size to size activations for (default: config.pbtxt max_batch_size, "
                                         "or the ONNX model's fixed batch)", check=at_least(1), fix="pass a batch size of 1 or more")
    name: str | None = option(None, "model name for --onnx/--engine-metadata (default: from the file name)")
    bundle: Path | None = option(None, "write launch-mig.sh, docker-compose.yml, k8s/", metavar="DIR")
    image: str = option(BundleSettings.image, "tritonserver image for compose and Kubernetes")
    max_gpus: int = option(BundleSettings.max_gpus, "Kubernetes autoscaling: grow each profile up to N GPUs' worth of MIG devices",
                           metavar="N", check=at_least(1), fix="use 1 or more GPUs")
    engine_build_s: int = option(BundleSettings.engine_build_s, "Kubernetes startupProbe: seconds allowed per model for its "
                                 "TensorRT engine build on first load (plus a base of "
                                 f"{BundleSettings.startup_base_s}s)", metavar="S", check=at_least(1), fix="use 1 second or more")
    monitor_labels: tuple[str, ...] = option(tuple(f"{k}={v}" for k, v in BundleSettings.monitor_labels),
                                             "ServiceMonitor label KEY=VALUE (repeatable; default: release=kube-prometheus-stack, "
                                             "the label kube-prometheus-stack selects by: use your Helm release name)",
                                             flag="--monitor-label", metavar="KEY=VALUE",
                                             check=lambda v: None if all("=" in x and x.split("=", 1)[0] for x in v) else "is not KEY=VALUE",
                                             fix="pass --monitor-label release=<your kube-prometheus-stack release>")
    from_tune: tuple[Path, ...] = option((), "report dirs of `tune --profile P` runs (one per slice type): instances, batching and "
                                             "layout ranking from those measurements instead of the heuristic; a 'whole-gpu' run is the full "
                                             "profile's capacity, scaled by SM share to the others (estimated); profiles cpu-N rehearse "
                                             "on this CPU", metavar="DIR")


_EPILOG = f"""\
examples:
  python -m pipeline mig-plan --gpu H200-141GB --onnx model.onnx --max-batch 64
  python -m pipeline mig-plan --gpu H200-141GB --layout 3x2g.35gb,1x1g.18gb --repository model_repository \\
      --bundle deploy/mig
  python -m pipeline mig-plan --from-nvidia-smi query.csv --from-nvidia-smi lgip.txt \\
      --from-nvidia-smi devices.txt --engine-metadata model.plan.json

GPUs with built-in tables: {", ".join(BUILTIN_GPUS)}.
--from-nvidia-smi reads (and tells apart) the output of
  nvidia-smi mig -lgip                                     profiles (its numbers beat the built-in table)
  nvidia-smi -L                                            MIG devices + UUIDs (the layout, if --layout is absent)
  nvidia-smi --query-gpu=name,mig.mode.current,memory.total --format=csv    which GPU (instead of --gpu)
{HEURISTIC}.
--bundle DIR writes launch-mig.sh (one tritonserver per MIG device), docker-compose.yml and
k8s/ (Deployments, Services, autoscalers, monitoring, KServe); with --repository it also writes
<model>/configs/<profile>.pbtxt, selected on each server with --model-config-name=<profile>, and the
bundle finds that repository relative to itself (without it, set MODEL_REPOSITORY).
"""


def register(subparsers: Any) -> None:
    """Add the ``mig-plan`` subcommand."""
    p = subparsers.add_parser(
        "mig-plan",
        help="plan Triton model instances per MIG slice and write per-profile configs and a launch bundle",
        description="How many instances of each model fit on each MIG slice of an A100/H100/H200, "
        "by memory (engine metadata or ONNX at max batch) and a compute cap from the slice's SMs.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, MigPlanConfig)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Plan, print the table, and write configs and the bundle when asked."""
    from pipeline.core.console import console as make_console

    cfg = checked_config(MigPlanConfig, args)
    console = make_console()
    if cfg.from_tune:
        from pipeline.mig.measured import is_cpu_rehearsal, print_measured_plan, read_tune_runs

        measured = read_tune_runs(list(cfg.from_tune))
        print_measured_plan(console, measured, None if is_cpu_rehearsal(measured) else _gpu(cfg.gpu, _read_nvidia_smi(cfg.from_nvidia_smi)))
        return 0
    smi = _read_nvidia_smi(cfg.from_nvidia_smi)
    gpu = _gpu(cfg.gpu, smi)
    devices = [d for g in smi.get("list", []) for d in g.mig_devices]
    layout = _layout(cfg.layout, gpu, smi)
    # Models with only KIND_CPU instances (the CPU INT8 variant) run on the host's cores: no MIG slice.
    from pipeline.triton.s3repository import readable

    with readable(cfg.repository) if cfg.repository is not None else contextlib.nullcontext(None) as local:  # s3://: a copy, read here
        repository_configs = {n: (m.config, m.path) for n, m in read_repository(local).items()
                              if not m.config.instance_group or any(g.kind != g.KIND_CPU for g in m.config.instance_group)} if local else {}
        memory = _memory(cfg, repository_configs)
        plan = plan_instances(gpu, memory, layout)
        _print_plan(console, plan)
        if cfg.bundle is not None:
            _write_bundle(console, plan, cfg.bundle, cfg, repository_configs, devices or None)
    return 0


def _read_nvidia_smi(files: tuple[Path, ...]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for path in files:
        require(path.is_file(), f"nvidia-smi output {path} does not exist")
        text = path.read_text()
        kind = nvidia_smi.kind_of_output(text)
        require(kind not in parsed, f"two files of nvidia-smi {kind} output were given", "pass each kind once")
        parsed[kind] = {
            "lgip": nvidia_smi.parse_lgip,
            "list": nvidia_smi.parse_list_gpus,
            "query": nvidia_smi.parse_query_csv,
        }[kind](text)
    return parsed


def _gpu(name: str | None, smi: dict[str, Any]) -> GpuMig:
    if "query" in smi:
        queried = nvidia_smi.gpu_key_from_query(smi["query"][0])
        require(name is None or name.lower() == queried.lower(), f"--gpu {name} disagrees with the nvidia-smi CSV ({queried})",
                "drop --gpu or pass the CSV of the GPU you mean")
        name = queried
    if "lgip" in smi:
        return nvidia_smi.gpu_from_lgip(smi["lgip"], name or "GPU from nvidia-smi -lgip")
    if name is None and "list" in smi:
        gpu = next((g for g in smi["list"] if g.mig_devices), smi["list"][0])
        name = nvidia_smi.gpu_key_from_list(gpu)  # -L names the GPU
    require(name is not None, "no GPU given",
            f"pass --gpu (one of {', '.join(BUILTIN_GPUS)}), a --query-gpu CSV or the `nvidia-smi -L` output")
    return builtin_gpu(str(name))


def _layout(text: str | None, gpu: GpuMig, smi: dict[str, Any]) -> Layout | None:
    first = next((g for g in smi.get("list", []) if g.mig_devices), None)
    from_devices = layout_from_devices([d.profile for d in first.mig_devices], gpu) if first else None
    if text is None:
        return from_devices
    layout = parse_layout(text, gpu)
    if from_devices is not None:
        require(layout.counts() == from_devices.counts(),
                f"--layout {layout} differs from the MIG devices in the nvidia-smi -L output ({from_devices})",
                "drop --layout to plan the devices that exist, or pass -L output of that layout")
    return layout


def _memory(cfg: MigPlanConfig, repository_configs: dict[str, Any]) -> dict[str, MemoryEstimate]:
    sources = sum(x is not None for x in (cfg.onnx or cfg.engine_metadata, cfg.repository))
    require(sources == 1, "say what to plan: --onnx and/or --engine-metadata, or --repository",
            "pass exactly one model source")
    if cfg.repository:
        out = {}
        for name, (config, model_dir) in repository_configs.items():
            try:
                out[name] = memory_for_model_dir(model_dir, cfg.max_batch or max(1, config.max_batch_size))
            except PipelineError as exc:  # a repository holds many models: say which one
                raise PipelineError(f"model {name}: {exc.problem}", exc.fix) from None
        return out
    batch: int | None = cfg.max_batch or (_fixed_batch(cfg.onnx) if cfg.onnx else None)
    if cfg.engine_metadata:
        name = cfg.name or cfg.engine_metadata.name.split(".")[0]
        return {name: memory_from_engine_metadata(cfg.engine_metadata, cfg.onnx, batch)}
    assert cfg.onnx is not None  # one model source, checked above
    if batch is None:
        raise PipelineError(f"{cfg.onnx} has a dynamic batch axis", "pass --max-batch N to size activations for")
    return {cfg.name or cfg.onnx.stem: memory_from_onnx(cfg.onnx, batch)}


def _fixed_batch(onnx_path: Path) -> int | None:
    from pipeline.data.tensors import signature_from_onnx

    require(onnx_path.is_file(), f"ONNX model {onnx_path} does not exist")
    first = signature_from_onnx(onnx_path).inputs[0].shape
    return first[0] if first and isinstance(first[0], int) and first[0] > 0 else None


def _print_plan(console: Any, plan: MigPlan) -> None:
    from rich.table import Table

    layout = f", layout {plan.layout}" if plan.layout else " (every profile; pass --layout for a real layout)"
    slices = Table(title=f"MIG slices — {plan.gpu.name}{layout}")
    for column in ("profile", "devices", "SMs", "memory GiB", "used / budget GiB"):
        slices.add_column(column, justify="left" if column == "profile" else "right", no_wrap=True)
    for p in plan.profiles:
        slices.add_row(p.profile.name, str(p.devices) if plan.layout else "", str(p.profile.sm_count),
                       f"{p.profile.memory_gib:.2f}", f"{p.used_bytes / GIB:.2f} / {p.budget_bytes / GIB:.2f}")
    console.print(slices)
    # Models are rows, so any number of them (with long names) fits; profile names are short columns.
    instances = Table(title="Instances per MIG slice (per device)")
    instances.add_column("model", overflow="fold")
    for p in plan.profiles:
        instances.add_column(p.profile.name, justify="right", no_wrap=True, min_width=len(p.profile.name))
    for model in plan.memory:
        instances.add_row(model, *(str(p.instances(model)) if p.instances(model) else "—" for p in plan.profiles))
    console.print(instances)
    for name, est in plan.memory.items():
        console.print(f"[bold]{name}[/]: {est.source}: {est.detail}", highlight=False)
    console.print(f"Heuristic: {HEURISTIC}.", highlight=False)
    for profile, model, reason in plan.exclusions:
        console.print(f"[yellow]excluded[/] {model} from {profile}: {reason}", highlight=False)


def _write_bundle(console: Any, plan: MigPlan, out: Path, cfg: MigPlanConfig, repository_configs: dict[str, Any], devices: Any) -> None:
    if not any(p.loaded for p in plan.profiles):
        raise PipelineError("no model fits any planned MIG profile, so there is nothing to launch",
                            "use larger profiles or a smaller --max-batch")
    labels = tuple((key, value) for key, _, value in (x.partition("=") for x in cfg.monitor_labels))
    settings = BundleSettings(image=cfg.image, max_gpus=cfg.max_gpus, engine_build_s=cfg.engine_build_s, monitor_labels=labels)
    write_bundle(out, plan, settings, devices, repository=cfg.repository)
    where = f"the repository {cfg.repository}" if cfg.repository else "$MODEL_REPOSITORY (set it: no --repository given)"
    console.print(f"wrote the MIG bundle to {out}/ ({LAUNCH_SCRIPT}, docker-compose.yml, k8s/), serving {where}", highlight=False)
    if not repository_configs:
        console.print("no --repository: write configs/<profile>.pbtxt with the build (build --mig)", highlight=False)
        return
    if isinstance(cfg.repository, S3Url):
        log.warning("the per-profile configs are not written to %s (its servers fall back to each model's config.pbtxt): "
                    "build --mig into a folder and publish that to give each profile its own", cfg.repository)
        return
    for name, (config, model_dir) in repository_configs.items():
        files = {path: config_text(cfg) for path, cfg in profile_configs(config, plan, name).items()}
        written = write_profile_configs(model_dir, files)
        console.print(f"{name}: {', '.join(p.name for p in written) or 'no profile fits'}", highlight=False)

