"""GPU memory one Triton model needs on a MIG slice, split into what instances share and what each
instance adds.

Two sources, best first:

1. **Engine metadata** (TensorRT plan): the engine stage records the engine's device memory
   (execution-context activations/scratch, ``device_memory_size_v2``) as ``device_memory_bytes``
   and the plan's size as ``plan_bytes``; a ``weights_bytes`` key is used when present, else the
   plan size stands in for the weights. Triton's TensorRT backend shares one ``ICudaEngine``
   between all instances of a model on the same GPU (``device_engines_`` in tensorrt_backend), so
   weights count once and each instance adds its execution contexts' device memory: one context per
   optimization profile the config names (every profile of the plan, see :func:`execution_contexts`).
   The device memory is the execution context's whole need, TensorRT's scratch for the tactics it
   chose (at most the build's workspace limit) included, so no workspace is added on top.
2. **ONNX model at max batch** (ONNX Runtime backend): Triton's ORT backend builds one session
   per instance, so each instance holds its own copy of the weights. Weights = initializer and
   Constant bytes. Activations = the sum of every non-weight tensor's bytes (inputs, node
   outputs) with the batch axis set to max batch, from ONNX shape inference; tensors whose
   shape inference cannot size (data-dependent, e.g. NonZero) are measured by running the model
   once in ONNX Runtime on an all-ones max-batch sample with those tensors exposed as outputs.
   The sum ignores buffer reuse, so it is an upper bound of ORT's peak; planning with it
   never overcommits a slice. When the model's GPU instances run ONNX Runtime's TensorRT
   execution provider (the ``tensorrt`` accelerator every GPU config of this project carries),
   each instance's session also builds and holds a TensorRT engine: its weights (estimated as the
   ONNX weights again: an FP16/INT8 engine stores less) and TensorRT's workspace, up to
   ``max_workspace_size_bytes`` (the config's value, else
   :data:`pipeline.triton.accelerators.TRT_WORKSPACE_BYTES`, 1 GiB), per instance.

Fixed costs (constants below, documented reasoning):

- ``PROCESS_OVERHEAD_BYTES`` = 512 MiB once per tritonserver (one per MIG device): a CUDA
  context on Hopper/Ampere takes roughly 300–500 MiB with eager module loading (less with
  CUDA 12.2+ lazy loading, the default), plus Triton's CUDA memory pool
  (``--cuda-memory-pool-byte-size`` default 64 MiB per GPU). We take the top of that range.
- ``INSTANCE_OVERHEAD_BYTES`` = 64 MiB per instance: each ORT session/TensorRT execution
  context gets its own CUDA stream, cuBLAS/cuDNN handles and workspace.
- ``HEADROOM_FRACTION`` = 10% of the slice is left free for allocator fragmentation and for
  estimates that are build-time numbers.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.data.artifacts import Artifact
from pipeline.data.tensors import load_onnx
from pipeline.triton.accelerators import TRT_WORKSPACE_BYTES, gpu_accelerator_parameters

log = logging.getLogger(__name__)

MIB = 1 << 20
PROCESS_OVERHEAD_BYTES = 512 * MIB
INSTANCE_OVERHEAD_BYTES = 64 * MIB
HEADROOM_FRACTION = 0.10

# Key spellings accepted in engine metadata JSON (top level or under "memory"/"engine").
DEVICE_MEMORY_KEYS = (
    "device_memory_bytes",
    "device_memory_size",
    "device_memory_size_bytes",
    "deviceMemorySize",
    "device_memory",
)
WEIGHTS_KEYS = ("weights_bytes", "weights_size", "weights_size_bytes", "weight_bytes", "engine_weights_bytes")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one model on one server: ``shared`` once, plus ``per_instance`` per instance."""

    source: str  # what the numbers were read or estimated from
    shared_bytes: int
    per_instance_bytes: int
    detail: str = ""

    def bytes_for(self, instances: int) -> int:
        """Bytes for ``instances`` instances of this model (server overhead not included)."""
        return self.shared_bytes + instances * self.per_instance_bytes


def _itemsize(elem_type: int) -> int:
    from onnx import helper

    try:
        return max(1, np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)
    except (KeyError, TypeError, ValueError):
        return 1  # 4-bit and other sub-byte types: round up


def weight_bytes(model: Any) -> int:
    """Bytes of all initializers and Constant tensors (from dims; external data is not read)."""
    total = sum(math.prod(t.dims) * _itemsize(t.data_type) for t in model.graph.initializer)
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.HasField("t"):
                    total += math.prod(attr.t.dims) * _itemsize(attr.t.data_type)
    return int(total)


def _fix_batch(model: Any, max_batch: int) -> None:
    """Give every graph input concrete dims: the batch axis (axis 0 if dynamic) = max_batch."""
    initializers = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            if axis != 0:
                raise PipelineError(
                    f"input '{value.name}' has a dynamic axis {axis} ('{dim.dim_param or '?'}') "
                    "besides the batch axis, so its activation memory cannot be sized",
                    "export the model with fixed non-batch dims, or plan it from its TensorRT plan's engine metadata "
                    "(mig-plan --engine-metadata <plan>.json: the engine's memory for its profiles)",
                )
            dim.Clear()
            dim.dim_value = max_batch


def _known_bytes(value: Any) -> int | None:
    ttype = value.type.tensor_type
    if not ttype.HasField("shape"):
        return None
    dims = []
    for d in ttype.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(d.dim_value)
    return math.prod(dims) * _itemsize(ttype.elem_type)


def activation_bytes(onnx_path: Path, max_batch: int) -> tuple[int, list[str]]:
    """Sum of bytes of every non-weight tensor at ``max_batch``; also the names that were measured.

    Sizes come from shape inference; the names it cannot size are measured with ONNX Runtime.
    """
    import onnx

    model = load_onnx(onnx_path, external_data=False)
    _fix_batch(model, max_batch)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    infos = {v.name: v for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)}
    weights = {i.name for i in model.graph.initializer}
    weights |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    names = [v.name for v in model.graph.input if v.name not in weights]
    names += [o for n in model.graph.node if n.op_type != "Constant" for o in n.output if o]
    total, unknown = 0, []
    for name in dict.fromkeys(names):  # keep order, drop duplicates
        size = _known_bytes(infos[name]) if name in infos else None
        if size is None:
            unknown.append(name)
        else:
            total += size
    if unknown:
        total += _measured_bytes(onnx_path, max_batch, unknown)
    return int(total), unknown


def _measured_bytes(onnx_path: Path, max_batch: int, names: list[str]) -> int:
    """Run the model once on an all-ones max-batch sample and sum the sizes of ``names``.

    Ones (not zeros) so data-dependent shapes such as NonZero's come out at their largest.
    """
    import onnx

    from pipeline.backend.onnxrt import session_from_proto

    model = load_onnx(onnx_path, external_data=False)  # ONNX Runtime reads the weights from their data file, if any
    _fix_batch(model, max_batch)
    outputs = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in outputs)
    session = session_from_proto(model, Path(onnx_path).parent)
    feeds = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) else max_batch for d in spec.shape]
        dtype = _ORT_TYPES.get(spec.type)
        if dtype is None:
            raise PipelineError(f"cannot make a sample for input '{spec.name}' of type {spec.type}")
        feeds[spec.name] = np.ones(shape, dtype=dtype)
    results = session.run(names, feeds)
    log.info("measured %d tensor(s) that shape inference could not size", len(names))
    return int(sum(np.asarray(r).nbytes for r in results))


_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def memory_from_onnx(onnx_path: Path, max_batch: int, tensorrt_workspace: tuple[int, str] | None = None) -> MemoryEstimate:
    """Per-instance memory of an ONNX model served by Triton's ONNX Runtime backend.

    ``tensorrt_workspace`` (bytes, where the number comes from) when the GPU instances run ONNX
    Runtime's TensorRT EP: each instance then also holds an engine (≈ the ONNX weights) and the workspace.
    """

    if max_batch < 1:
        raise PipelineError(f"max batch {max_batch} is not a batch size", "use --max-batch 1 or more")
    if not Path(onnx_path).is_file():
        raise PipelineError(f"ONNX model {onnx_path} does not exist", "pass the path of a .onnx file")
    weights = weight_bytes(load_onnx(onnx_path, external_data=False))
    activations, measured = activation_bytes(Path(onnx_path), max_batch)
    detail = (
        f"weights {_size(weights)} + activations {_size(activations)} at batch "
        f"{max_batch} + {INSTANCE_OVERHEAD_BYTES // MIB} MiB instance overhead; one ORT session "
        "(own weights) per instance"
    )
    if measured:
        detail += f"; {len(measured)} tensor(s) measured with ONNX Runtime"
    engine = 0
    if tensorrt_workspace is not None:
        workspace, origin = tensorrt_workspace
        engine = weights + workspace
        detail += (f"; TensorRT EP per instance: engine ≈ ONNX weights {_size(weights)} + workspace {_size(workspace)} "
                   f"(max_workspace_size_bytes, {origin})")
    return MemoryEstimate(
        source=f"ONNX {Path(onnx_path).name} at batch {max_batch}" + (" with TensorRT" if tensorrt_workspace else ""),
        shared_bytes=0,
        per_instance_bytes=weights + activations + INSTANCE_OVERHEAD_BYTES + engine,
        detail=detail,
    )


def tensorrt_workspace_of(config: Any, origin: str) -> tuple[int, str] | None:
    """(workspace bytes, where from) when ``config`` gives GPU instances the ``tensorrt`` accelerator, else None."""
    params = gpu_accelerator_parameters(config, "tensorrt")
    if params is None:
        return None
    if "max_workspace_size_bytes" in params:
        return int(params["max_workspace_size_bytes"]), origin
    return TRT_WORKSPACE_BYTES, "ONNX Runtime's default, pipeline.triton.accelerators.TRT_WORKSPACE_BYTES"


def memory_for_artifact(artifact: Artifact, max_batch: int) -> MemoryEstimate:
    """Memory of a build artifact: a plan from its metadata JSON, an ONNX file from the model."""
    if artifact.kind == "plan":
        if artifact.metadata is None:
            raise PipelineError(f"plan {artifact.path} has no engine metadata JSON", "rebuild the engine")
        return memory_from_engine_metadata(artifact.metadata)
    # The build's GPU configs give every non-CPU ONNX variant the tensorrt accelerator (accelerators.py).
    workspace = None if artifact.cpu_only else (TRT_WORKSPACE_BYTES, "the build's configs: pipeline.triton.accelerators.TRT_WORKSPACE_BYTES")
    return memory_from_onnx(artifact.path, max_batch, workspace)


def _size(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / MIB:.2f} MiB" if n >= MIB else f"{n / 1024:.1f} KiB"


def _lookup(data: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for scope in (data, data.get("memory"), data.get("engine")):
        if isinstance(scope, dict):
            for key in keys:
                value = scope.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                    return int(value)
    return None


def memory_from_engine_metadata(
    metadata_path: Path, onnx_path: Path | None = None, max_batch: int | None = None
) -> MemoryEstimate:
    """Memory of a TensorRT plan from its metadata JSON (weights shared, device memory per instance).

    The engine stage writes ``device_memory_bytes`` and ``plan_bytes``; weights, when not given
    (``weights_bytes`` and the other spellings in WEIGHTS_KEYS), are taken as the serialized
    plan's size (the plan beside the JSON, else ``plan_bytes``): an upper bound, since the plan
    also holds kernels. A missing device memory comes from the ONNX activations (needs
    ``onnx_path`` and ``max_batch``); if nothing can fill it the error names the keys looked for.
    """
    path = Path(metadata_path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PipelineError(f"cannot read engine metadata {path}: {exc}", "pass the engine helper's JSON") from None
    if not isinstance(data, dict):
        raise PipelineError(f"engine metadata {path} is not a JSON object")
    return memory_from_metadata(data, f"engine metadata {path.name}", path.parent, onnx_path, max_batch)


def memory_from_metadata(
    data: dict[str, Any],
    source: str,
    plan_dir: Path | None = None,
    onnx_path: Path | None = None,
    max_batch: int | None = None,
) -> MemoryEstimate:
    """:func:`memory_from_engine_metadata` for metadata already loaded (``plan_dir``: where its plan is)."""
    device = _lookup(data, DEVICE_MEMORY_KEYS)
    weights = _lookup(data, WEIGHTS_KEYS)
    notes = []
    if weights is None:
        plan = _plan_beside(plan_dir, data) if plan_dir is not None else None
        if plan is not None:
            weights = plan.stat().st_size
            notes.append(f"weights ≈ size of {plan.name}")
        elif (plan_bytes := _lookup(data, ("plan_bytes",))) is not None:
            weights = plan_bytes
            notes.append("weights ≈ plan_bytes")
    if (device is None or weights is None) and onnx_path is not None and max_batch is not None:

        if weights is None:
            weights = weight_bytes(load_onnx(onnx_path, external_data=False))
            notes.append("weights from the ONNX initializers")
        if device is None:
            device = activation_bytes(Path(onnx_path), max_batch)[0]
            notes.append(f"device memory from ONNX activations at batch {max_batch}")
    if device is None or weights is None:
        missing = "device memory" if device is None else "weights size"
        keys = DEVICE_MEMORY_KEYS if device is None else (*WEIGHTS_KEYS, "plan_bytes")
        raise PipelineError(
            f"{source} has no {missing} (looked for {', '.join(keys)})",
            "rebuild the engine with the engine stage, or also pass --onnx and --max-batch",
        )
    contexts = execution_contexts(data)
    per_context = f"{contexts} execution contexts (one per optimization profile) × {_size(device)}" if contexts > 1 else \
        f"execution-context device memory {_size(device)}"
    detail = (
        f"engine weights {_size(weights)} once (shared by instances) + {per_context} "
        f"(TensorRT scratch included) + {INSTANCE_OVERHEAD_BYTES // MIB} MiB per instance"
    )
    if notes:
        detail += "; " + "; ".join(notes)
    return MemoryEstimate(
        source=source,
        shared_bytes=weights,
        per_instance_bytes=contexts * device + INSTANCE_OVERHEAD_BYTES,
        detail=detail,
    )


def execution_contexts(data: dict[str, Any]) -> int:
    """Execution contexts one instance of a plan holds: one per optimization profile its config names.
    The build names every profile (:func:`pipeline.triton.config.plan_profile_names`), and Triton's TensorRT
    backend creates an ``IExecutionContext``, with its own device memory, for each (``trt_contexts_`` in
    tensorrt_backend ``instance_state.cc``); metadata without profiles: one."""
    profiles = data.get("profiles")
    return max(1, len(profiles)) if isinstance(profiles, list) and any(isinstance(p, dict) and p for p in profiles) else 1


def _plan_beside(plan_dir: Path, data: dict[str, Any]) -> Path | None:
    named = data.get("plan")
    candidates = [plan_dir / Path(named).name] if isinstance(named, str) else []
    candidates.append(plan_dir / "model.plan")
    return next((c for c in candidates if c.is_file()), None)


def memory_for_model_dir(model_dir: Path, max_batch: int) -> MemoryEstimate:
    """Memory of a Triton model directory's latest version: plan metadata, else its ONNX file.

    Plan metadata is read from ``.pipeline-report.json`` (the build records each version's engine
    metadata there), else from a metadata JSON beside the plan (``model.plan.json``).
    """
    from pipeline.triton.repository import model_versions

    model_dir = Path(model_dir)
    versions = model_versions(model_dir)  # Triton's rule for what is a version folder
    if not versions:
        raise PipelineError(f"model directory {model_dir} has no numeric version folder", "expected <model>/1/model.*")
    latest = model_dir / str(versions[-1])
    if (latest / "model.plan").is_file():
        recorded = _report_metadata(model_dir, latest.name)
        if recorded is not None:
            return memory_from_metadata(recorded, f"engine metadata of {model_dir.name}/{latest.name}", latest)
        for candidate in sorted(latest.glob("*.json")):
            try:
                data = json.loads(candidate.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(data, dict) and _lookup(data, DEVICE_MEMORY_KEYS) is not None:
                return memory_from_metadata(data, f"engine metadata {candidate.name}", latest)
        raise PipelineError(
            f"{latest / 'model.plan'} has no engine metadata with its device memory",
            "publish it with the build (it records the metadata in .pipeline-report.json)",
        )
    if (latest / "model.onnx").is_file():
        return memory_from_onnx(latest / "model.onnx", max_batch, _config_workspace(model_dir))
    raise PipelineError(f"{latest} holds neither model.plan nor model.onnx", "point --repository at a Triton model repository")


def _report_metadata(model_dir: Path, version: str) -> dict[str, Any] | None:
    from pipeline.triton.repository import REPORT

    report = model_dir / REPORT
    try:
        data = json.loads(report.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    entry = data.get("versions", {}).get(version) if isinstance(data, dict) else None
    metadata = entry.get("engine_metadata") if isinstance(entry, dict) else None
    return metadata if isinstance(metadata, dict) else None


def _config_workspace(model_dir: Path) -> tuple[int, str] | None:
    """The TensorRT workspace the model's ``config.pbtxt`` gives its GPU instances (None: no TensorRT, or no config)."""
    from pipeline.triton.config import parse_config

    path = model_dir / "config.pbtxt"
    if not path.is_file():
        return None
    return tensorrt_workspace_of(parse_config(path.read_text(), str(path)), f"{model_dir.name}/config.pbtxt")
