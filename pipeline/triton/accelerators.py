"""What a GPU instance of an ONNX model runs on: ONNX Runtime's TensorRT and CUDA execution providers,
as Triton's onnxruntime backend reads them from ``optimization { execution_accelerators { ... } }``.

Decisions (keys as the backend's ``src/onnxruntime.cc`` parses them; the same file's CUDA defaults):

* One ``config.pbtxt`` still serves CPU and GPU: the backend reads ``gpu_execution_accelerator`` only
  for GPU instances, so a ``KIND_AUTO`` model resolved to ``KIND_CPU`` (a server without a GPU, the
  local rehearsal) ignores the block, and configs that pin ``KIND_CPU`` get none.
* ``tensorrt`` with the variant's ``precision_mode`` (FP32, FP16, INT8): an NGC Triton without a
  prebuilt plan still runs TensorRT kernels. INT8 takes its scales from the explicit Q/DQ nodes (no
  calibration table, which would fail a Q/DQ model). ``max_workspace_size_bytes`` is the backend's
  stated default (1 GiB), written out so a MIG profile's config can lower it. Engines are cached in
  :func:`trt_cache_dir` (see "Engine cache" below). For inputs whose only dynamic axis is the batch, the
  TensorRT profile spans batch 1..max batch (optimum at the largest preferred batch): without it
  ONNX Runtime rebuilds the engine each time a larger batch arrives.
* ``cuda`` for the nodes TensorRT leaves (all of them where TensorRT is missing): ``use_tf32: "0"``.
  TF32 is ONNX Runtime's default on Ampere and later; on an H200 it moved the bundled model's FP32
  outputs by up to 1.5e-3 from CPU FP32 (7.5e-7 with it off), beyond ``verify``'s 1e-3 served-vs-
  in-process tolerance. The FP16 variant is the fast one; FP32 stays FP32. (TensorRT itself may still
  pick TF32 kernels for FP32 layers: its builder allows TF32 by default and the EP has no switch.)
* Nothing sends INT8 nodes back to the CPU: INT8 configs keep ``graph { level: 2 }`` (all ONNX Runtime
  graph optimizations off), which also keeps ORT's ``WeightBiasQuantization`` pass from adding int32
  bias DequantizeLinear nodes that have no CUDA kernel (measured on an H200: with default
  optimizations they fell back to the CPU).

Engine cache (``trt_engine_cache_path``), from ONNX Runtime's TensorRT EP source
(``onnxruntime/core/providers/tensorrt/tensorrt_execution_provider.cc`` as stored in the search
index — a 1.16-era microsoft/onnxruntime version, and a later port of the same provider with the
same code for these parts; ``TRTGenerateId`` in ``tensorrt_execution_provider_utils.h``), and the
onnxruntime_backend ``src/onnxruntime.cc`` (2026) that passes the key through unchanged:

* ``TensorrtExecutionProvider::TensorrtExecutionProvider`` (the constructor, run for every
  session) does ``if (!fs::is_directory(cache_path_)) if (!fs::create_directory(cache_path_))
  throw``: only the leaf is created, and ``std::filesystem::create_directory`` throws when the
  parent is missing or not writable — ``/tmp/trt-engine-cache/<model>`` fails the load in a fresh
  container. So the path is one level under ``/tmp`` (:data:`TRT_CACHE_PREFIX` + model), whose
  parent exists (mode 1777) in every image and in an ``emptyDir`` mounted there: the config loads
  even where no bundle prepared anything. The check-then-create is not atomic either, and the
  backend loads instances in parallel (``TRITONBACKEND_BackendAttributeSetParallelModelInstanceLoading(…,
  true)``): when two instances of one model find no directory, one ``create_directory`` returns
  false and that instance fails. So every bundle also creates each model's directory before the
  server starts (:func:`cache_setup_shell`: the compose/docker command, a Kubernetes init container,
  the MIG launch script), and the constructor then only finds it.
* ``CreateNodeComputeInfoFromGraph`` (``Compile`` in older releases) checks for the engine file,
  deserializes it, or builds and writes it (a plain ``std::ofstream``: truncate and write, no
  temporary file and rename, no file lock) all inside ``GetApiLock()`` — a function-local static
  mutex, so one per process. Instances of a model inside one tritonserver therefore never see a
  half-written engine: the first builds and writes it, the others read the finished file. Two
  *processes* sharing one directory are not protected (a reader can get a partial file: "could not
  deserialize engine from cache", the load fails), so each container/pod gets its own ``/tmp``
  (compose/docker: the container's; Kubernetes: an ``emptyDir``), never a shared volume. The
  launch script's servers on one host do share ``/tmp``: see docs/ngc.md.
* The engine file's name comes from ``TRTGenerateId``: a hash of the model's *file name*
  (``model.onnx`` for every Triton model), input and node-output names, ORT/TensorRT/CUDA versions
  and the compute capability — not the weights. Hence one directory per model (two models with the
  same layer names must not share files), and the bundles empty the cache at container start: a new
  version of a model, with the same names, would otherwise load the previous version's engine.
* The path is absolute under ``/tmp``, so a read-only repository is never written to (nothing
  else in these keys writes beside the model: no timing cache, no EP-context dump).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any

from pipeline.data.tensors import ModelSignature

TRT_PRECISION = {"fp32": "FP32", "fp16": "FP16", "int8": "INT8", "u8": "FP32"}  # u8: FP32 with uint8 inputs
TRT_WORKSPACE_BYTES = 1 << 30
TRT_CACHE_PREFIX = "/tmp/trt-engine-cache-"  # + the model name: one level under /tmp (see "Engine cache")


def trt_profile_shapes(signature: ModelSignature, max_batch: int, opt_batch: int) -> dict[str, str] | None:
    """``trt_profile_{min,opt,max}_shapes`` for batch 1 / ``opt_batch`` / ``max_batch``, or None when
    an input has a dynamic axis besides the batch (TensorRT then sizes its profile from the traffic)."""
    if max_batch <= 0:
        return None
    rows: dict[str, list[str]] = {"min": [], "opt": [], "max": []}
    for spec in signature.inputs:
        rest = list(spec.shape[1:])
        if not all(isinstance(d, int) and d >= 0 for d in rest):
            return None
        for key, batch in (("min", 1), ("opt", opt_batch), ("max", max_batch)):
            rows[key].append(f"{spec.name}:{'x'.join(str(d) for d in [batch, *rest])}")
    return {f"trt_profile_{key}_shapes": ",".join(values) for key, values in rows.items()}


def trt_cache_dir(model: str) -> str:
    """Where the TensorRT accelerator of ``model`` caches its engines (see "Engine cache" above)."""
    return f"{TRT_CACHE_PREFIX}{model}"


def cache_setup_shell(models: Iterable[str], *, clear: bool = True) -> str:
    """The shell command that prepares the engine cache of ``models`` before tritonserver starts:
    empty it (``clear``: engines are keyed by layer names, not weights) and create each model's
    directory, so ONNX Runtime's non-atomic check-then-create never runs for two instances at once."""
    dirs = " ".join(shlex.quote(trt_cache_dir(m)) for m in sorted(set(models)))
    if not dirs:
        return "true"
    return f"rm -rf {dirs} && mkdir -p {dirs}" if clear else f"mkdir -p {dirs}"


def uses_tensorrt(cfg: Any) -> bool:
    """Whether ``cfg`` gives its GPU instances the ``tensorrt`` accelerator."""
    return gpu_accelerator_parameters(cfg, "tensorrt") is not None


def add_gpu_accelerators(cfg: Any, *, precision: str, signature: ModelSignature) -> None:
    """Add the ``tensorrt`` and ``cuda`` GPU execution accelerators to an ONNX model's ``ModelConfig``."""
    accelerators = cfg.optimization.execution_accelerators.gpu_execution_accelerator
    del accelerators[:]
    trt = accelerators.add(name="tensorrt")
    trt.parameters["precision_mode"] = TRT_PRECISION[precision]
    trt.parameters["max_workspace_size_bytes"] = str(TRT_WORKSPACE_BYTES)
    trt.parameters["trt_engine_cache_enable"] = "1"
    trt.parameters["trt_engine_cache_path"] = trt_cache_dir(cfg.name)
    preferred = list(cfg.dynamic_batching.preferred_batch_size)
    profile = trt_profile_shapes(signature, cfg.max_batch_size, max(preferred or [cfg.max_batch_size]))
    for key, value in (profile or {}).items():
        trt.parameters[key] = value
    cuda = accelerators.add(name="cuda")
    cuda.parameters["use_tf32"] = "0"


def gpu_accelerator_parameters(cfg: Any, name: str) -> dict[str, str] | None:
    """The parameters of the GPU accelerator ``name`` in ``cfg``, or None when it has none."""
    for accelerator in cfg.optimization.execution_accelerators.gpu_execution_accelerator:
        if accelerator.name == name:
            return dict(accelerator.parameters)
    return None


def refit_trt_profile(cfg: Any) -> None:
    """Set the batch axis of ``cfg``'s TensorRT profile shapes (if any) to 1 / largest preferred / max
    batch, after a change of ``max_batch_size`` or preferred sizes (a tune candidate, a MIG profile)."""
    trt = next((a for a in cfg.optimization.execution_accelerators.gpu_execution_accelerator if a.name == "tensorrt"), None)
    if trt is None or "trt_profile_max_shapes" not in trt.parameters:
        return
    if cfg.max_batch_size <= 0:
        for key in ("min", "opt", "max"):
            trt.parameters.pop(f"trt_profile_{key}_shapes", None)
        return
    opt = max(list(cfg.dynamic_batching.preferred_batch_size) or [cfg.max_batch_size])
    for key, batch in (("min", 1), ("opt", opt), ("max", cfg.max_batch_size)):
        entries = []
        for entry in trt.parameters[f"trt_profile_{key}_shapes"].split(","):
            name, _, dims = entry.rpartition(":")
            entries.append(f"{name}:{'x'.join([str(batch), *dims.split('x')[1:]])}")
        trt.parameters[f"trt_profile_{key}_shapes"] = ",".join(entries)
