"""What the build orchestrator (pipeline/build/orchestrator.py) needs beside its stages: output kinds
decided against the labels, the evaluation batch size, the bundled model's data, the tool versions
recorded in the manifest."""

from __future__ import annotations

import logging
import platform
from importlib import metadata
from pathlib import Path

import numpy as np

from pipeline.accuracy.evaldata import UNNAMED, EvalData, check_targets, label_arrays, plain_labels_owner
from pipeline.accuracy.outputkinds import OutputKind, decide_kinds, output_info, parse_output_kinds
from pipeline.build.config import BuildConfig
from pipeline.data.buckets import read_arrays
from pipeline.data.tensors import ModelSignature
from pipeline.data.workspace import ModelData

log = logging.getLogger(__name__)

TOOLS = ("tensorflow-cpu", "tensorflow", "keras", "tf2onnx", "onnx", "onnxruntime", "onnxconverter-common", "polygraphy", "tritonclient", "nvidia-pytriton", "numpy", "tensorrt")
EVAL_BATCH = 64


def decided_kinds(signature: ModelSignature, described: list[dict] | None, producers: dict[str, str], targets: list[dict[str, np.ndarray]],
                   cfg: BuildConfig, where: str) -> tuple[dict[str, OutputKind], str | None]:
    """Kinds from the model (and the labels' types, for linear outputs), with every bucket's labels checked against them."""
    overrides = parse_output_kinds(cfg.output_kinds)
    first = decide_kinds(signature, described=described, producers=producers, overrides=overrides)
    owner = plain_labels_owner(sorted({k for t in targets for k in t}), output_info(signature, first), where)
    named = [{(owner if k == UNNAMED and owner else k): v for k, v in t.items()} for t in targets]  # owner is set where labels are plain
    kinds = decide_kinds(signature, described=described, producers=producers, overrides=overrides, targets=named[0] if named else None)
    for bucket in named:
        check_targets(bucket, output_info(signature, kinds), where)
    return kinds, owner


def early_labels(path: Path) -> list[dict[str, np.ndarray]]:
    """The label arrays of the evaluation file, checked for what needs no model (numbers, finite), one dict per bucket
    (none for a folder of images or a file of sentences: their labels are read with them)."""
    from pipeline.data.raw_files import is_image_folder, is_text_file

    if not path.exists() or is_image_folder(path) or is_text_file(path):
        return []
    by_bucket: dict[str, dict[str, np.ndarray]] = {}
    for (output, bucket), array in label_arrays(path, read_arrays(path)).items():
        by_bucket.setdefault(bucket, {})[output] = array
    return list(by_bucket.values())


def note_needs(onnx_fp32: Path, cfg: BuildConfig) -> None:
    """Before the stages that run the model, one line when its weights (the FP32 ONNX model's tensors) cannot keep
    ``--max-memory-gib`` (:func:`pipeline.backend.budget.memory_need`), and one when the disk is short
    (:func:`note_disk_need`)."""
    from pipeline.backend.budget import memory_need
    from pipeline.core.onnx_files import graph_proto, tensor_bytes

    line = memory_need(tensor_bytes(graph_proto(onnx_fp32)), cfg.max_memory_gib)
    if line:
        log.warning("%s", line)
    note_disk_need(onnx_fp32, cfg)


# Each variant's file, in FP32 models' worth: written once in the workspace (FP32's is already there when this is
# asked) and once more in a local repository. Measured on a 2.2 GB recommender: 6.3 GB more after the export, 3 × 2.1 GB.
_VARIANT_SHARE = {"fp32": 1.0, "fp16": 0.5, "int8": 0.25, "int8cpu": 0.25, "u8": 1.0}


def disk_need(model_bytes: int, precisions: tuple[str, ...], local_repository: bool) -> int:
    """Bytes the rest of the build writes beside an exported FP32 model of ``model_bytes``: every variant but FP32 in
    the workspace, and all of them again in a local repository (see :data:`_VARIANT_SHARE`)."""
    workspace = sum(_VARIANT_SHARE.get(p, 1.0) for p in precisions if p != "fp32")
    repository = sum(_VARIANT_SHARE.get(p, 1.0) for p in precisions) if local_repository else 0.0
    return int(model_bytes * (workspace + repository))


def note_disk_need(onnx_fp32: Path, cfg: BuildConfig) -> None:
    """After the export, one line when the workspace's disk has less free space than the rest of the build writes
    (:func:`disk_need`): a 2 GB model's build should say so now, not fail for space an hour in."""
    import shutil

    from pipeline.core.onnx_files import total_size

    need = disk_need(total_size(onnx_fp32), cfg.precisions, local_repository=isinstance(cfg.repository, Path))
    free = shutil.disk_usage(onnx_fp32.parent).free
    if need > free:
        log.warning("the rest of the build writes about %.1f GiB (its variants, and their copies in a local repository) and the disk of %s "
                    "has %.1f GiB free: free space, or choose --workdir and --repository on a larger disk", need / 2**30, onnx_fp32.parent,
                    free / 2**30)


def ensure_default_data(data_dir: ModelData) -> None:
    """The bundled model's eval/calibration data, regenerated (deterministically, offline) where missing,
    e.g. when building outside the source tree."""
    from pipeline.models import digits

    if not data_dir.complete():
        log.info("writing the bundled model's evaluation and calibration data to %s", data_dir.folder)
        digits.write_data(data_dir.folder)


ISOLATE_OVER = 64 << 20  # bytes of FP32 model from which each stage runs in its own process (a second of start-up each)
# What the build process holds while a stage runs in its child (measured: 410 MiB beside ResNet50's calibration): the
# budget is for the build, every process together, so a stage in its own process sizes its batches to the rest.
BUILD_PROCESS_GIB = 0.5


def stage_budget_gib(onnx_fp32: Path, max_memory_gib: float) -> float:
    """The memory a stage sizes its batches to: ``max_memory_gib``, less :data:`BUILD_PROCESS_GIB` where the model's
    stages run in their own processes (:data:`ISOLATE_OVER`); never less than half the budget."""
    from pipeline.core.onnx_files import total_size

    if total_size(onnx_fp32) < ISOLATE_OVER:
        return max_memory_gib
    return max(max_memory_gib - BUILD_PROCESS_GIB, max_memory_gib / 2)


def eval_batch(onnx_path: Path, data: EvalData, max_memory_gib: float, *, runners: int) -> int:
    """The parity/accuracy batch: at most EVAL_BATCH, and small enough that ``runners`` models holding
    a batch of the largest samples stay within the memory budget together."""
    from pipeline.backend.budget import batch_for_budget, memory_estimate

    largest: dict[str, tuple[int, ...]] = {}
    for _, shapes, _ in data.sample_shapes():
        for name, shape in shapes.items():
            old = largest.get(name)
            largest[name] = shape if old is None else tuple(max(a, b) for a, b in zip(old, shape))
    return batch_for_budget(memory_estimate(onnx_path, largest), stage_budget_gib(onnx_path, max_memory_gib), max_batch=EVAL_BATCH, runners=runners)


def tool_versions() -> dict[str, str]:
    """Versions of Python and of the installed tools the build uses."""
    versions = {"python": platform.python_version()}
    for dist in TOOLS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions
