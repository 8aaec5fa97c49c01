"""Triton model configs built from a model's real signature, and the checks that keep them honest.

Decisions (each checked against the Triton sources/docs named here):

* Instance kind. ONNX models get ``KIND_AUTO``: Triton turns it into ``KIND_GPU`` on every visible
  GPU when there is one, else ``KIND_CPU`` (core ``model_config_utils.cc``), so one config serves on
  a GPU production server and on the CPU-only local server. ``KIND_GPU`` would fail to load on the
  latter. TensorRT plans can only run on a GPU, so they always get ``KIND_GPU``. The CPU INT8 variant
  (``<name>_int8cpu``, ``Artifact.cpu_only``) is made for ONNX Runtime's CPU integer kernels and gets
  ``KIND_CPU``, so a GPU server runs it on its CPU (or the deployment leaves it unloaded) rather than on a GPU.
* INT8 Q/DQ ONNX models get ``optimization { graph { level: 2 } }``. Triton's onnxruntime backend
  maps 2 → ``ORT_DISABLE_ALL`` (-1 → BASIC, 1 → EXTENDED, else ALL; backend ``src/onnxruntime.cc``).
  Only with every optimization off do the served numbers follow the Q/DQ graph exactly (float math
  between explicit QuantizeLinear/DequantizeLinear, as TensorRT computes): EXTENDED/ALL fuse Q/DQ
  into integer kernels (QLinearConv, MatMulIntegerToFloat; their u8s8 path saturates on CPUs
  without VNNI), and even BASIC changed the digits INT8 probabilities by up to 0.046 against exact
  Q/DQ (caught by ``python -m pipeline verify``). The local Python backend reads the same field.
  The CPU INT8 variant is the exception: its integer kernels are the point, so its config leaves
  ``optimization.graph`` unset (ORT_ENABLE_ALL), the level its accuracy gate ran at.
* ONNX models that may get GPU instances carry ONNX Runtime's TensorRT (the variant's precision) and
  CUDA (TF32 off) execution accelerators; CPU instances ignore them (:mod:`pipeline.triton.accelerators`).
* Warmup uses real samples: one raw little-endian file per input in ``<model>/warmup/``, named by
  ``input_data_file`` (Triton reads ``<model dir>/warmup/<input_data_file>``, one sample without the
  batch axis, and repeats it ``batch_size`` times). One warmup entry per distinct batch size of
  {1, preferred sizes, max batch}.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.core.errors import PipelineError, require
from pipeline.data.artifacts import Artifact
from pipeline.data.tensors import ModelSignature, TensorSpec, dequantizes_a_table, signature_from_onnx
from pipeline.triton.accelerators import add_gpu_accelerators

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

WARMUP_DIR = "warmup"
QDQ_GRAPH_LEVEL = 2  # Triton onnxruntime backend: 2 → ORT_DISABLE_ALL (exact Q/DQ semantics)
# Triton's onnxruntime backend mapping of optimization.graph.level (not ORT's enum order).
ORT_LEVEL_BY_GRAPH_LEVEL = {0: "ORT_ENABLE_ALL", -1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}  # other levels: ALL
KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU")

_PLATFORM = {"onnx": ("onnxruntime_onnx", "onnxruntime", "model.onnx"), "plan": ("tensorrt_plan", "tensorrt", "model.plan")}
_NP_TO_TRITON = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
    "object": "TYPE_STRING", "str": "TYPE_STRING", "bytes": "TYPE_STRING",
}
# Spellings engine metadata may use: numpy names, TensorRT DataType names, Triton names.
_ALIASES = {
    "float": "TYPE_FP32", "fp32": "TYPE_FP32", "half": "TYPE_FP16", "fp16": "TYPE_FP16",
    "double": "TYPE_FP64", "fp64": "TYPE_FP64", "bf16": "TYPE_BF16", "bfloat16": "TYPE_BF16",
    "int8": "TYPE_INT8", "uint8": "TYPE_UINT8", "int32": "TYPE_INT32", "int64": "TYPE_INT64", "bool": "TYPE_BOOL",
}
_ITEMSIZE = {
    "TYPE_BOOL": 1, "TYPE_UINT8": 1, "TYPE_INT8": 1, "TYPE_UINT16": 2, "TYPE_INT16": 2, "TYPE_FP16": 2,
    "TYPE_BF16": 2, "TYPE_UINT32": 4, "TYPE_INT32": 4, "TYPE_FP32": 4, "TYPE_UINT64": 8, "TYPE_INT64": 8,
    "TYPE_FP64": 8,
}
_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _pb() -> Any:
    # tritonclient.grpc takes ~0.4 s to import: only pay it when a config is built or read.
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2


def triton_dtype(dtype: np.dtype | str) -> str:
    """The Triton ``TYPE_*`` name for a numpy dtype or an engine-metadata dtype string."""
    if isinstance(dtype, str):
        text = dtype.strip()
        text = text.split(".")[-1] if text.lower().startswith(("datatype.", "trt.", "tensorrt.")) else text
        if text.upper().startswith("TYPE_"):
            return text.upper()
        key = text.lower()
        if key in _ALIASES:
            return _ALIASES[key]
        try:
            dtype = np.dtype(key)
        except TypeError:
            raise PipelineError(f"unknown tensor data type '{text}'", "use a numpy, TensorRT or Triton type name") from None
    name = np.dtype(dtype).name
    if name.startswith(("str", "bytes")):
        name = "object"
    if name not in _NP_TO_TRITON:
        raise PipelineError(f"Triton has no data type for numpy '{name}'", "export the model with standard numeric I/O types")
    return _NP_TO_TRITON[name]


def config_dims(spec: TensorSpec, max_batch: int) -> list[int]:
    """Triton dims of one tensor: batch axis stripped when ``max_batch > 0``, dynamic dims → -1."""
    dims = [d if isinstance(d, int) and d >= 0 else -1 for d in spec.shape]
    if max_batch > 0:
        require(
            bool(dims) and dims[0] == -1,
            f"tensor '{spec.name}' has shape {list(spec.shape)}: its first axis is not a dynamic batch axis, "
            f"so Triton cannot batch it (max_batch {max_batch})",
            "export the model with a dynamic first axis named 'batch', or use max batch 0",
        )
        dims = dims[1:]
    return dims


def warmup_file_name(input_name: str) -> str:
    """File name (inside ``warmup/``) of the real warmup sample of one input."""
    return _FILE_SAFE.sub("_", input_name) + ".bin"


def model_config_from_artifact(
    artifact: Artifact,
    *,
    name: str,
    signature: ModelSignature,
    max_batch: int,
    labels_file: str | None = None,
    classifier_output: str | None = None,
    warmup: Mapping[str, np.ndarray] | None = None,
    preferred_batch_sizes: Sequence[int] = (),
    max_queue_delay_us: int = 100,
    instance_count: int = 1,
    kind: str | None = None,
) -> ModelConfig:
    """The Triton ``ModelConfig`` serving ``artifact`` as model ``name``.

    I/O names, dtypes and dims come from ``signature`` (``signature_from_onnx`` of the model the
    artifact was made from) and are checked against the artifact: the ONNX file itself, or the
    engine metadata JSON of a plan. ``kind`` defaults to ``KIND_AUTO`` for ONNX and must be
    ``KIND_GPU`` for plans. ``warmup`` holds real input samples (first axis = sample, as in
    ``calib.npz``); write their bytes with :func:`warmup_files`. ``labels_file`` is a file name in the
    model directory attached to ``classifier_output`` (Triton's classification extension).
    """
    pb = _pb()
    require(artifact.kind in _PLATFORM, f"artifact kind '{artifact.kind}' cannot be served", "use an 'onnx' or 'plan' artifact")
    require(bool(name) and "/" not in name and not name.startswith("."), f"'{name}' is not a valid Triton model name", "use letters, digits, '_' or '-'")
    require(max_batch >= 0, f"max batch {max_batch} is negative", "use 0 (no batching) or a positive max batch")
    require(instance_count >= 1, f"instance count {instance_count} is below 1", "use at least one instance")
    require(max_queue_delay_us >= 0, f"max queue delay {max_queue_delay_us} µs is negative", "use 0 or more microseconds")

    cfg = pb.ModelConfig(name=name, max_batch_size=max_batch)
    cfg.platform, cfg.backend, cfg.default_model_filename = _PLATFORM[artifact.kind]
    for spec in signature.inputs:
        _set_io(cfg.input.add(), spec, max_batch, pb)
    for spec in signature.outputs:
        _set_io(cfg.output.add(), spec, max_batch, pb)

    if classifier_output is not None or labels_file is not None:
        if classifier_output is None or labels_file is None:
            raise PipelineError("a labels file needs a classifier output and vice versa", "pass both labels_file and classifier_output, or neither")
        require(Path(labels_file).name == labels_file and not labels_file.startswith("."), f"labels file '{labels_file}' is not a plain file name", "name a file in the model directory, e.g. labels.txt")
        outputs = {o.name: o for o in cfg.output}
        require(classifier_output in outputs, f"the model has no output named '{classifier_output}'", f"use one of: {', '.join(outputs)}")
        outputs[classifier_output].label_filename = labels_file

    if max_batch > 0:
        sizes = sorted(set(preferred_batch_sizes))
        bad = [b for b in sizes if not 1 <= b <= max_batch]
        require(not bad, f"preferred batch sizes {bad} are outside 1..{max_batch}", f"use sizes from 1 to the max batch {max_batch}")
        cfg.dynamic_batching.preferred_batch_size.extend(sizes)
        cfg.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
    else:
        require(not preferred_batch_sizes, "preferred batch sizes need batching", "drop them, or use a max batch above 0")

    group = cfg.instance_group.add()
    group.count = instance_count
    group.kind = pb.ModelInstanceGroup.Kind.Value(_kind_for(artifact, kind))
    if artifact.kind == "plan" and artifact.metadata is not None:
        group.profile.extend(plan_profile_names(artifact.metadata))

    if artifact.kind == "onnx" and not artifact.cpu_only and has_qdq(artifact.path):
        cfg.optimization.graph.level = QDQ_GRAPH_LEVEL
    if artifact.kind == "onnx" and dequantizes_a_table(_onnx_file(artifact.path)):
        # ONNX Runtime dequantizes it whole per request: without the arena that block is returned, not kept (0.6 vs 4.7 GB for 2 GB)
        cfg.parameters["enable_mem_arena"].string_value = "0"
    if artifact.kind == "onnx" and group.kind != pb.ModelInstanceGroup.KIND_CPU:
        add_gpu_accelerators(cfg, precision=artifact.precision, signature=signature)

    if warmup:
        samples = _warmup_samples(signature, warmup, max_batch)
        for batch in sorted({1, *cfg.dynamic_batching.preferred_batch_size, max(max_batch, 1)}):
            entry = cfg.model_warmup.add(name=f"real_sample_batch_{batch}", batch_size=batch)
            for spec, sample in samples:
                item = entry.inputs[spec.name]
                item.data_type = pb.DataType.Value(triton_dtype(spec.dtype))
                item.dims.extend(sample.shape)
                item.input_data_file = warmup_file_name(spec.name)

    if artifact.kind == "onnx":
        check_config_against_onnx(cfg, _onnx_file(artifact.path))
    elif artifact.metadata is None:
        raise PipelineError(f"plan {artifact.path} has no engine metadata JSON", "rebuild the engine so its metadata JSON is written next to it")
    else:
        check_config_against_engine(cfg, artifact.metadata)
    return cfg


def plan_profile_names(metadata: Path | Mapping[str, Any]) -> list[str]:
    """Every optimization profile of a plan, as ``instance_group.profile`` names them ("0", "1", …).

    Triton's TensorRT backend gives an instance one execution context per profile its group names
    and runs each request in the context whose profile admits it; a group naming none gets profile 0
    only (tensorrt_backend ``instance_state.cc``; model_config.proto: "If not specified, the server
    will select the first optimization profile by default"). So every profile the build's gate ran
    is named. A plan without dynamic inputs (no profile with shapes) names none."""
    where = f"engine metadata {metadata}" if isinstance(metadata, Path) else "engine metadata"
    profiles: Any = _load_metadata(Path(metadata) if isinstance(metadata, str) else metadata, where).get("profiles")
    if not isinstance(profiles, list) or not any(isinstance(p, Mapping) and p for p in profiles):
        return []
    return [str(index) for index in range(len(profiles))]


def warmup_files(signature: ModelSignature, warmup: Mapping[str, np.ndarray], max_batch: int) -> dict[str, bytes]:
    """``{"warmup/<input>.bin": raw little-endian bytes of one real sample}``, matching the config's
    ``model_warmup``; pass it in ``extra_files`` to :func:`pipeline.triton.repository.publish_repository`."""
    return {
        f"{WARMUP_DIR}/{warmup_file_name(spec.name)}": sample.astype(sample.dtype.newbyteorder("<"), copy=False).tobytes()
        for spec, sample in _warmup_samples(signature, warmup, max_batch)
    }


def warmup_input_bytes(item: Any) -> int | None:
    """Bytes Triton reads from the ``input_data_file`` of a ``ModelWarmup.Input`` (None for strings)."""
    itemsize = _ITEMSIZE.get(_pb().DataType.Name(item.data_type))
    return None if itemsize is None else itemsize * int(np.prod(list(item.dims), dtype=np.int64))


def config_text(cfg: ModelConfig) -> str:
    """The ``config.pbtxt`` text of ``cfg`` (protobuf text format)."""
    from google.protobuf import text_format

    return text_format.MessageToString(cfg)


def parse_config(text: str, where: str = "Triton model config") -> ModelConfig:
    """Parse ``config.pbtxt`` text the way Triton does (protobuf text format); PipelineError naming ``where`` if invalid."""
    from google.protobuf import text_format

    try:
        return text_format.Parse(text, _pb().ModelConfig())
    except text_format.ParseError as exc:
        raise PipelineError(f"{where} is not a valid Triton model config: {exc}", "rebuild the repository with `python -m pipeline build`") from None


def model_config_path(model_dir: Path, config_name: str | None = None) -> Path:
    """The config file Triton reads for a model: ``configs/<config_name>.pbtxt`` if present (Triton's
    ``--model-config-name``), else ``config.pbtxt``."""
    custom = Path(model_dir) / "configs" / f"{config_name}.pbtxt"
    return custom if config_name and custom.is_file() else Path(model_dir) / "config.pbtxt"


def read_model_config(model_dir: Path, config_name: str | None = None) -> ModelConfig | None:
    """The model's config as Triton would load it (see :func:`model_config_path`), or None if it has none."""
    path = model_config_path(model_dir, config_name)
    return parse_config(path.read_text(), str(path)) if path.is_file() else None


def ort_graph_level_name(cfg: ModelConfig) -> str:
    """The ONNX Runtime optimization level Triton's onnxruntime backend uses for ``cfg``."""
    if not cfg.HasField("optimization") or not cfg.optimization.HasField("graph"):
        return "ORT_ENABLE_ALL"
    return ORT_LEVEL_BY_GRAPH_LEVEL.get(cfg.optimization.graph.level, "ORT_ENABLE_ALL")


def has_qdq(onnx_path: Path) -> bool:
    """Whether the ONNX graph holds explicit QuantizeLinear/DequantizeLinear nodes (weights not loaded)."""
    import onnx

    graph = onnx.load(str(_onnx_file(onnx_path)), load_external_data=False).graph
    return any(node.op_type in ("QuantizeLinear", "DequantizeLinear") for node in graph.node)


def check_config_against_onnx(cfg: ModelConfig, onnx_path: Path) -> None:
    """Raise PipelineError naming the first input/output whose name, dtype or dims differ from the ONNX model."""
    signature = signature_from_onnx(_onnx_file(onnx_path))
    model_io = {
        "input": {s.name: (triton_dtype(s.dtype), _full_dims(s)) for s in signature.inputs},
        "output": {s.name: (triton_dtype(s.dtype), _full_dims(s)) for s in signature.outputs},
    }
    _check_io(cfg, model_io, f"ONNX model {Path(onnx_path).name}", "rebuild the config from this model's signature")


def check_config_against_engine(cfg: ModelConfig, metadata: Path | Mapping[str, Any]) -> None:
    """Raise PipelineError naming the first mismatch between ``cfg`` and a TensorRT engine's metadata JSON.

    Checks I/O names, dtypes and dims (``{"inputs": [{"name", "dtype", "shape"}], "outputs": [...]}``),
    that the batch axis is dynamic when ``max_batch_size > 0``, and that every optimization profile
    the config uses (``instance_group.profile``, else profile 0) admits batch 1..``max_batch_size``
    and the warmup shapes.
    """
    if isinstance(metadata, str):
        metadata = Path(metadata)
    where = f"engine metadata {metadata}" if isinstance(metadata, Path) else "engine metadata"
    meta = _load_metadata(metadata, where)
    model_io: dict[str, dict[str, tuple[str, list[int]]]] = {}
    for key in ("input", "output"):
        entries: Any = meta.get(f"{key}s")
        require(isinstance(entries, list) and bool(entries), f"{where} has no '{key}s' list", "rebuild the engine; its metadata must list inputs and outputs")
        model_io[key] = {}
        for entry in entries:
            require(isinstance(entry, Mapping) and "name" in entry, f"{where} has an {key} entry without a name: {entry!r}", "rebuild the engine metadata")
            shape = entry.get("shape", entry.get("dims"))
            dtype = entry.get("dtype", entry.get("data_type"))
            require(isinstance(shape, list) and dtype is not None, f"{where}: {key} '{entry['name']}' lacks dtype or shape", "rebuild the engine metadata")
            model_io[key][str(entry["name"])] = (triton_dtype(str(dtype)), [_metadata_dim(d, where) for d in shape])
    _check_io(cfg, model_io, where, "rebuild the config from the ONNX model the engine was built from")
    if cfg.max_batch_size > 0:
        _check_profiles(cfg, meta, model_io["input"], where)


def _set_io(io: Any, spec: TensorSpec, max_batch: int, pb: Any) -> None:
    io.name = spec.name
    io.data_type = pb.DataType.Value(triton_dtype(spec.dtype))
    dims = config_dims(spec, max_batch)
    if dims:
        io.dims.extend(dims)
    else:
        # A [batch] tensor: Triton needs non-empty dims, so declare [1] and reshape to [] for the model.
        io.dims.append(1)
        io.reshape.SetInParent()


def _kind_for(artifact: Artifact, kind: str | None) -> str:
    if kind is None:
        return "KIND_GPU" if artifact.kind == "plan" else "KIND_CPU" if artifact.cpu_only else "KIND_AUTO"
    require(kind in KINDS, f"unknown instance kind '{kind}'", f"use one of {', '.join(KINDS)}")
    require(artifact.kind != "plan" or kind == "KIND_GPU", f"a TensorRT plan cannot run with {kind}", "use KIND_GPU for plans")
    return kind


def _warmup_samples(signature: ModelSignature, warmup: Mapping[str, np.ndarray], max_batch: int) -> list[tuple[TensorSpec, np.ndarray]]:
    names = {s.name for s in signature.inputs}
    files = [warmup_file_name(n) for n in names]
    require(len(set(files)) == len(files), f"inputs {sorted(names)} map to the same warmup file name", "give the model inputs names that differ in letters, digits, '_', '.' or '-'")
    extra = sorted(set(warmup) - names)
    require(not extra, f"warmup data has arrays {extra} that are not model inputs", f"use the input names: {', '.join(sorted(names))}")
    samples = []
    for spec in signature.inputs:
        require(spec.name in warmup, f"warmup data has no array for input '{spec.name}'", "give one array per model input (e.g. from calib.npz)")
        array = np.asarray(warmup[spec.name])
        rank = len(spec.shape) - (1 if max_batch > 0 else 0)
        if array.ndim == rank + 1:
            require(array.shape[0] >= 1, f"warmup array '{spec.name}' holds no samples", "give at least one sample")
            array = array[0]
        require(array.ndim == rank, f"warmup array '{spec.name}' has shape {array.shape}, the model wants rank {rank} per sample", "give samples shaped like the model input")
        for got, want in zip(array.shape, config_dims(spec, max_batch)):
            require(want in (-1, got), f"warmup sample '{spec.name}' has shape {array.shape}, the model wants {config_dims(spec, max_batch)}", "give samples shaped like the model input")
        require(array.dtype != object and spec.dtype != np.dtype(object), f"input '{spec.name}' is a string tensor", "warm up string inputs with Triton's zero_data instead")
        require(np.can_cast(array.dtype, spec.dtype, casting="same_kind"), f"warmup array '{spec.name}' is {array.dtype}, the model input is {spec.dtype}", f"convert it to {spec.dtype}")
        samples.append((spec, np.ascontiguousarray(array.astype(spec.dtype))))
    return samples


def _onnx_file(path: Path) -> Path:
    path = Path(path)
    return path / "model.onnx" if path.is_dir() else path


def _full_dims(spec: TensorSpec) -> list[int]:
    return [d if isinstance(d, int) and d >= 0 else -1 for d in spec.shape]


def _config_full_dims(cfg: ModelConfig, io: Any) -> list[int]:
    dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
    return ([-1] if cfg.max_batch_size > 0 else []) + dims


def _check_io(cfg: ModelConfig, model_io: Mapping[str, Mapping[str, tuple[str, list[int]]]], where: str, fix: str) -> None:
    names = {"input": [i.name for i in cfg.input], "output": [o.name for o in cfg.output]}
    missing = [n for n in model_io["input"] if n not in names["input"]]
    require(not missing, f"config '{cfg.name}' lacks input '{missing[0] if missing else ''}' of the {where}", fix)
    for key, ios in (("input", cfg.input), ("output", cfg.output)):
        for io in ios:
            require(io.name in model_io[key], f"config '{cfg.name}' has {key} '{io.name}' but the {where} has no such {key} (it has: {', '.join(model_io[key])})", fix)
            dtype, model_dims = model_io[key][io.name]
            config_type = _pb().DataType.Name(io.data_type)
            require(config_type == dtype, f"config '{cfg.name}' {key} '{io.name}' is {config_type} but the {where} says {dtype}", fix)
            dims = _config_full_dims(cfg, io)
            # Triton's rule: a dynamic model dim admits any config dim, a fixed one needs the same value.
            same = len(dims) == len(model_dims) and all(m == -1 or c == m for c, m in zip(dims, model_dims))
            require(same, f"config '{cfg.name}' {key} '{io.name}' has dims {dims} (batch axis as -1) but the {where} has {model_dims}", fix)


def _metadata_dim(value: Any, where: str) -> int:
    if value is None or isinstance(value, str):  # dynamic: null, -1 or a named axis
        return -1
    require(isinstance(value, int) and not isinstance(value, bool), f"{where} has a non-integer dimension {value!r}", "rebuild the engine metadata")
    return value if value >= 0 else -1


def _load_metadata(metadata: Path | Mapping[str, Any], where: str) -> Mapping[str, Any]:
    if isinstance(metadata, Mapping):
        return metadata
    try:
        meta = json.loads(Path(metadata).read_text())
    except FileNotFoundError:
        raise PipelineError(f"{where} does not exist", "rebuild the engine so its metadata JSON is written") from None
    except json.JSONDecodeError as exc:
        raise PipelineError(f"{where} is not valid JSON ({exc})", "rebuild the engine") from None
    require(isinstance(meta, Mapping), f"{where} is not a JSON object", "rebuild the engine")
    return meta


def _check_profiles(cfg: ModelConfig, meta: Mapping[str, Any], inputs: Mapping[str, tuple[str, list[int]]], where: str) -> None:
    profiles: Any = meta.get("profiles")
    require(isinstance(profiles, list) and bool(profiles), f"{where} lists no optimization profiles, so max batch {cfg.max_batch_size} cannot be checked", "rebuild the engine with an optimization profile for the batch axis")
    used = sorted({int(p) for g in cfg.instance_group for p in g.profile} or {0})
    ranges_of: dict[int, dict[str, tuple[list[int], list[int]]]] = {}
    for index in used:
        require(0 <= index < len(profiles), f"config '{cfg.name}' uses profile {index} but the {where} has {len(profiles)}", "use a profile index the engine has")
        profile = profiles[index]
        ranges_of[index] = {}
        for name in inputs:
            ranges: Any = profile.get(name) if isinstance(profile, Mapping) else None
            require(isinstance(ranges, Mapping) and all(k in ranges for k in ("min", "max")), f"{where}: profile {index} has no min/max shapes for input '{name}'", "rebuild the engine with a profile covering every input")
            low, high = [int(d) for d in ranges["min"]], [int(d) for d in ranges["max"]]
            require(
                low[0] <= 1 and high[0] >= cfg.max_batch_size,
                f"max batch {cfg.max_batch_size} of config '{cfg.name}' is outside profile {index} of the {where}: "
                f"input '{name}' admits batch {low[0]}..{high[0]}",
                f"use a max batch of at most {high[0]}, or rebuild the engine with a profile from batch 1 to {cfg.max_batch_size}",
            )
            ranges_of[index][name] = (low, high)
    # A warmup request runs, like any request, in the first named profile that admits every input's shape.
    for warmup in cfg.model_warmup:
        shapes = {name: [warmup.batch_size, *item.dims] for name, item in warmup.inputs.items() if name in inputs}
        if not any(all(_admits(ranges_of[index][name], shape) for name, shape in shapes.items()) for index in used):
            named = ", ".join(f"'{name}' {shape}" for name, shape in sorted(shapes.items()))
            raise PipelineError(f"warmup '{warmup.name}' ({named}) is outside every profile the config names ({', '.join(map(str, used))}) of the {where}",
                                "warm up with shapes the engine profiles admit")


def _admits(ranges: tuple[list[int], list[int]], shape: list[int]) -> bool:
    low, high = ranges
    return len(shape) == len(low) and all(lo <= d <= hi for lo, d, hi in zip(low, shape, high))
