"""What a model is, before any build: ``python -m pipeline inspect MODEL``.

For a ``.keras`` file, a SavedModel folder, ``module:function`` or an ONNX file: inputs and
outputs (dtypes, dynamic axes), the optimization profiles a build would use, op-type counts, for a
Q/DQ model which nodes are quantized (and how), and the check against TensorRT's ONNX parser
support (:mod:`pipeline.backend.trt_support`). Keras models are converted to ONNX first, exactly as
``build`` converts them (SavedModel, then tf2onnx), in a temporary folder. Polygraphy's own
summary (what ``polygraphy inspect model`` prints) comes along. A TensorRT plan needs the
``tensorrt`` module to be read; without it, the engine metadata JSON beside the plan is shown.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.backend.trt_seam import PolygraphyTensorRT, TensorRT
from pipeline.core.errors import PipelineError
from pipeline.data.profiles import ShapeProfile, profiles_from_json
from pipeline.data.tensors import TensorSpec, load_onnx, signature_from_onnx
from pipeline.stages.shapes import SeenBucket, profiles_from_args, seen_in_files

log = logging.getLogger(__name__)

QDQ = ("QuantizeLinear", "DequantizeLinear")
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass
class QuantizedNode:
    """A compute node fed through DequantizeLinear: which of its inputs, and with what scales."""

    node: str
    op: str
    inputs: dict[str, str]  # "input 1 (weight)" → "per-tensor" | "per-channel (axis N)"


@dataclass
class Inspection:
    """Everything ``inspect`` reports about one model (JSON-able through :meth:`as_json`)."""

    model: str
    kind: str
    onnx: str | None = None
    opset: int | None = None
    inputs: list[dict] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)
    op_counts: dict[str, int] = field(default_factory=dict)
    quantized: list[QuantizedNode] = field(default_factory=list)
    float_compute: list[str] = field(default_factory=list)  # Conv/Gemm/MatMul of a Q/DQ model left in float
    parser: dict[str, list[str]] = field(default_factory=dict)  # TensorRT version → problems (empty: parses)
    tensorrt: dict[str, Any] = field(default_factory=dict)  # TensorRT-RTX's build of the graph (pipeline.stages.trt_check); {}: not run
    polygraphy: str = ""
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        data = dict(vars(self))
        data["quantized"] = [vars(q) for q in self.quantized]
        return data


def tensor_dict(spec: TensorSpec) -> dict:
    """A tensor as the report shows it: name, dtype, dims (names for dynamic axes), dynamic axes."""
    return {"name": spec.name, "dtype": spec.dtype.name, "shape": list(spec.shape), "dynamic_axes": spec.dynamic_axes}


def inspection_from_model(
    model: str,
    *,
    shapes: Sequence[str] = (),
    max_batch: int = 64,
    data: Sequence[Path] = (),
    targets: Sequence[str] = (),
    show_layers: bool = False,
    opset: int = 17,
    tensorrt: TensorRT | None = None,
    allow_lambda: bool = False,
    compute_capability: str | None = None,
) -> Inspection:
    """Inspect ``model`` (see the module docstring); PipelineError for anything unreadable.
    A plan is read through ``tensorrt`` (default: the installed TensorRT, pipeline.backend.trt_seam);
    ``allow_lambda``: load Lambda layers of a .keras/.h5 file (pipeline/stages/keras2.py)."""
    path = Path(model)
    if path.suffix == ".plan" or path.suffix == ".engine":
        return _inspect_plan(path, tensorrt or PolygraphyTensorRT())
    if path.suffix == ".onnx":
        return inspection_from_onnx(path, shapes=shapes, max_batch=max_batch, data=data, targets=targets, show_layers=show_layers,
                                    compute_capability=compute_capability)
    from pipeline.stages.source import model_source

    source = model_source(model, allow_lambda=allow_lambda)  # .keras, .h5, SavedModel folder or module:function; raises on anything else
    with tempfile.TemporaryDirectory(prefix="inspect-") as tmp:
        onnx_path = onnx_from_source(source, Path(tmp), opset)
        report = inspection_from_onnx(onnx_path, shapes=shapes, max_batch=max_batch, data=data, targets=targets, show_layers=show_layers,
                                      compute_capability=compute_capability)
    report.model, report.kind = model, source.kind
    report.onnx = f"converted as build converts it (tf2onnx, opset {opset}); not kept"
    return report


def _built_with_rtx(path: Path, precision: str, profiles: list[ShapeProfile], compute_capability: str) -> dict[str, Any]:
    """The graph built by TensorRT-RTX as build's check builds it (pipeline/stages/trt_check.py), with build's default settings."""
    from pipeline.stages.engine import EngineSettings
    from pipeline.stages.trt_check import trt_check_from_onnx

    with tempfile.TemporaryDirectory(prefix="inspect-trt-") as tmp:
        report = trt_check_from_onnx([path], Path(tmp) / "check.json", engines=(EngineSettings(precision, tuple(profiles)),),
                                     compute_capability=compute_capability)
    entry = dict(report["variants"][precision])
    entry.pop("onnx", None)
    return {"checker": report["checker"], "compute_capability": compute_capability, **entry}


def onnx_from_source(source: Any, folder: Path, opset: int) -> Path:
    """The FP32 ONNX model ``build`` would make from ``source``, written into ``folder``."""
    from pipeline.stages.onnx_export import onnx_from_savedmodel
    from pipeline.stages.savedmodel import savedmodel_from_source

    saved = Path(source.path) if source.kind == "savedmodel" else savedmodel_from_source(source, folder / "savedmodel")
    return onnx_from_savedmodel(saved, folder / "model.onnx", opset)


def inspection_from_onnx(
    path: Path,
    *,
    shapes: Sequence[str] = (),
    max_batch: int = 64,
    data: Sequence[Path] = (),
    targets: Sequence[str] = (),
    show_layers: bool = False,
    compute_capability: str | None = None,
) -> Inspection:
    """Inspect an ONNX file (see the module docstring). Without ``targets``, where TensorRT-RTX is installed the graph
    is built with it for ``compute_capability`` (default: build's) with the profiles shown, and of the hand-written
    rules only the version-gated ones are kept (:func:`pipeline.backend.trt_support.version_gated`); with ``targets``, the
    hand-written rules of those TensorRT versions."""
    from pipeline.backend.trt_rtx import DEFAULT_COMPUTE_CAPABILITY, rtx_module
    from pipeline.backend.trt_support import check_onnx, op_counts, summarize, support_data, version_gated

    model = load_onnx(path)
    signature = signature_from_onnx(path)
    report = Inspection(str(path), "onnx", onnx=str(path))
    report.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    report.inputs = [tensor_dict(s) for s in signature.inputs]
    report.outputs = [tensor_dict(s) for s in signature.outputs]
    seen = [bucket for p in data for bucket in _seen_in(p, signature)]
    profiles: list[ShapeProfile] = profiles_from_args(shapes, signature, max_batch=max_batch, seen=seen)
    report.profiles = [str(p) or "(no dynamic inputs)" for p in profiles]
    report.op_counts = dict(sorted(op_counts(model).items(), key=lambda kv: (-kv[1], kv[0])))
    if any(op in report.op_counts for op in QDQ):
        report.quantized, report.float_compute = quantized_nodes(model)
    if not targets and rtx_module() is not None:
        precision = "int8" if any(op in report.op_counts for op in QDQ) else "fp32"  # labels the log line only
        report.tensorrt = _built_with_rtx(path, precision, profiles, compute_capability or DEFAULT_COMPUTE_CAPABILITY)
        report.parser[support_data()["build_minimum"]] = summarize(version_gated(model))
    for target in targets or (() if report.tensorrt else (support_data()["default_target"],)):
        report.parser[target] = summarize(check_onnx(model, target))
    report.polygraphy = _polygraphy_summary(model, show_layers)
    return report


def _seen_in(path: Path, signature: Any) -> list[SeenBucket]:
    """Sample shapes of the arrays at ``path`` (headers only), as build reads them."""
    if not Path(path).exists():
        raise PipelineError(f"'{path}' does not exist", "pass an .npz file or a folder of .npy files")
    found = seen_in_files(path, signature)
    if not found:
        raise PipelineError(f"'{path}' holds no .npz/.npy arrays", "pass an .npz file or a folder of .npy files")
    return found


def quantized_nodes(model: Any) -> tuple[list[QuantizedNode], list[str]]:
    """Compute nodes fed by DequantizeLinear (per input: per-tensor or per-channel scale), and the
    Conv/Gemm/MatMul nodes a Q/DQ model leaves in float."""
    from onnx import helper

    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    init_dims = {i.name: list(i.dims) for i in graph.initializer}
    found, floating = [], []
    for node in graph.node:
        if node.op_type in QDQ:
            continue
        inputs = {}
        for index, name in enumerate(node.input):
            dq = producer.get(name)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            scale_dims = init_dims.get(dq.input[1], [])
            axis = next((helper.get_attribute_value(a) for a in dq.attribute if a.name == "axis"), 1)
            source = dq.input[0]
            if source in producer and producer[source].op_type == "QuantizeLinear":  # weights quantized in the graph
                source = producer[source].input[0]
            what = "weight" if source in init_dims else "activation"
            inputs[f"input {index} ({what})"] = f"per-channel (axis {axis})" if scale_dims and scale_dims[0] > 1 else "per-tensor"
        if inputs:
            found.append(QuantizedNode(node.name or node.output[0], node.op_type, inputs))
        elif node.op_type in WEIGHTED:
            floating.append(f"{node.op_type} '{node.name or node.output[0]}'")
    return found, floating


def _polygraphy_summary(model: Any, show_layers: bool) -> str:
    from polygraphy.backend.onnx.util import str_from_onnx

    try:
        return str_from_onnx(model, show_layers=show_layers, show_attrs=show_layers, show_weights=False)
    except Exception as exc:  # Polygraphy's summary is a bonus: never the reason inspect fails
        return f"(Polygraphy could not summarize this model: {str(exc).splitlines()[0][:200]})"


def _inspect_plan(path: Path, tensorrt: TensorRT) -> Inspection:
    """A TensorRT plan: read through Polygraphy where TensorRT imports (host code refused); else its metadata JSON.
    Either way the metadata beside it, when there is one, says what the plan is bound to."""
    from pipeline.stages.engine import metadata_path

    if not path.is_file():
        raise PipelineError(f"plan '{path}' does not exist", "check the path")
    report = Inspection(str(path), "plan")
    meta = metadata_path(path)
    data = _plan_metadata(meta) if meta.is_file() else None
    if data is not None and (bound := _bound_to(data)):
        report.notes.append(bound)
    available, _ = tensorrt.status()
    if available:
        report.polygraphy = tensorrt.describe(path, allow_host_code=False)
        return report
    if data is None:
        raise PipelineError(
            f"cannot read TensorRT plan '{path}' here (reading a plan needs TensorRT and a GPU), and it has no metadata JSON beside it ({meta.name})",
            "inspect it on the machine with TensorRT and a GPU, or inspect the ONNX model it was built from",
        )
    report.notes.append(f"the plan itself cannot be read here (reading a plan needs TensorRT and a GPU); shown: its metadata {meta}")
    report.inputs = list(data.get("inputs", []))
    report.outputs = list(data.get("outputs", []))
    report.profiles = [str(p) for p in profiles_from_json(data.get("profiles", []))]
    return report


def _plan_metadata(meta: Path) -> dict[str, Any]:
    try:
        data = json.loads(meta.read_text())
    except ValueError as exc:
        raise PipelineError(f"plan metadata {meta} is not valid JSON ({exc})", "rebuild the plan (python -m pipeline build)") from None
    if not isinstance(data, dict):
        raise PipelineError(f"plan metadata {meta} is not a JSON object", "rebuild the plan (python -m pipeline build)")
    return data


def _bound_to(data: dict[str, Any]) -> str | None:
    """What the plan loads on, from its metadata: the line a GPU user needs before copying it to a server."""
    gpu = data.get("gpu")
    if not data.get("tensorrt_version") or not isinstance(gpu, dict):
        return None
    level = data.get("hardware_compatibility", "NONE")
    where = "any GPU of compute capability 8.0 or newer (hardware-compatible)" if level == "AMPERE_PLUS" else \
        f"GPUs of compute capability {gpu.get('compute_capability')} only"
    recorded = data.get("tf32")
    tf32 = "TF32 on" if recorded is True else "TF32 off" if recorded is False else "TF32 not recorded"
    return (f"built with TensorRT {data['tensorrt_version']} on {gpu.get('name')} (compute capability {gpu.get('compute_capability')}): "
            f"loads on that TensorRT version and {where}; {tf32}")


def counts_line(counts: dict[str, int]) -> str:
    """``Conv ×12, Relu ×12, …``."""
    return ", ".join(f"{op} ×{n}" for op, n in counts.items())


def quantized_summary(nodes: Sequence[QuantizedNode]) -> Counter[str]:
    """Quantized nodes per op type."""
    return Counter(q.op for q in nodes)
