"""What a GPU instance of an ONNX model runs on: ONNX Runtime's TensorRT and CUDA execution providers,
as Triton's onnxruntime backend reads them from ``optimization { execution_accelerators { ... } }``.

Decisions (keys as the backend's ``src/onnxruntime.cc`` parses them; the same file's CUDA defaults):

* One ``config.pbtxt`` still serves CPU and GPU: the backend reads ``gpu_execution_accelerator`` only
  for GPU instances, so a ``KIND_AUTO`` model resolved to ``KIND_CPU`` (a server without a GPU, the
  local rehearsal) ignores the block, and configs that pin ``KIND_CPU`` get none.
* ``tensorrt`` with the variant's ``precision_mode`` (FP32, FP16, INT8): an NGC Triton without a
  prebuilt plan still runs TensorRT kernels. INT8 takes its scales from the explicit Q/DQ nodes (no
  calibration table, which would fail a Q/DQ model). ``max_workspace_size_bytes`` is the backend's
  stated default (1 GiB), written out so a MIG profile's config can lower it. Engines are cached per
  model under ``/tmp`` (writable for the image's non-root user; the repository is mounted read-only),
  so an instance restart does not rebuild. For inputs whose only dynamic axis is the batch, the
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
"""

from __future__ import annotations

from typing import Any

from pipeline.tensors import ModelSignature

TRT_PRECISION = {"fp32": "FP32", "fp16": "FP16", "int8": "INT8", "u8": "FP32"}  # u8: FP32 with uint8 inputs
TRT_WORKSPACE_BYTES = 1 << 30
TRT_CACHE_ROOT = "/tmp/trt-engine-cache"


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


def add_gpu_accelerators(cfg: Any, *, precision: str, signature: ModelSignature) -> None:
    """Add the ``tensorrt`` and ``cuda`` GPU execution accelerators to an ONNX model's ``ModelConfig``."""
    accelerators = cfg.optimization.execution_accelerators.gpu_execution_accelerator
    del accelerators[:]
    trt = accelerators.add(name="tensorrt")
    trt.parameters["precision_mode"] = TRT_PRECISION[precision]
    trt.parameters["max_workspace_size_bytes"] = str(TRT_WORKSPACE_BYTES)
    trt.parameters["trt_engine_cache_enable"] = "1"
    trt.parameters["trt_engine_cache_path"] = f"{TRT_CACHE_ROOT}/{cfg.name}"
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
