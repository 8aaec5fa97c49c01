"""What a model's inputs and outputs are, read from the ONNX file (never guessed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.errors import PipelineError

if TYPE_CHECKING:
    import onnx

Dim = int | str  # a fixed size, or the name of a dynamic axis


SIGNATURE = "serving_default"  # the SavedModel signature the pipeline exports and converts


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, numpy dtype, and dims (int, or a named dynamic axis)."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]

    @property
    def dynamic_axes(self) -> list[int]:
        return [i for i, d in enumerate(self.shape) if not isinstance(d, int) or d < 0]


@dataclass(frozen=True)
class ModelSignature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise PipelineError(
            f"the model has no input named '{name}'",
            f"use one of: {', '.join(s.name for s in self.inputs)}",
        )


def load_onnx(path: Path, *, external_data: bool = True) -> onnx.ModelProto:
    """``onnx.load`` that turns a missing, truncated or corrupt file into one PipelineError."""
    import onnx

    if not Path(path).is_file():
        raise PipelineError(f"ONNX model '{path}' does not exist", "check the path, or build the model first")
    try:
        return onnx.load(str(path), load_external_data=external_data)
    except Exception as exc:  # protobuf DecodeError, OSError, ValueError: all mean an unreadable file
        raise PipelineError(f"cannot read ONNX model '{path}': {str(exc).splitlines()[0][:200] or type(exc).__name__}", "rebuild it; the file is corrupt or not ONNX") from None


def dequantizes_a_table(path: Path, min_elements: int = 64 << 20) -> bool:
    """Whether a DequantizeLinear of the ONNX model at ``path`` reads an initializer of ``min_elements`` or more: an int8
    embedding table in TensorRT's form (pipeline/stages/gather_tables.py), which ONNX Runtime dequantizes whole per run."""
    graph = load_onnx(path, external_data=False).graph
    sizes = {i.name: int(np.prod(i.dims)) for i in graph.initializer}
    return any(n.op_type == "DequantizeLinear" and sizes.get(n.input[0], 0) >= min_elements for n in graph.node)


def signature_from_onnx(path: Path) -> ModelSignature:
    """Read input/output names, dtypes and dims of an ONNX model (weights are not loaded)."""
    import onnx
    from onnx import helper

    model = load_onnx(path, external_data=False)
    initializers = {i.name for i in model.graph.initializer}

    def spec(value: "onnx.ValueInfoProto") -> TensorSpec:
        ttype = value.type.tensor_type
        dims: list[Dim] = []
        for d in ttype.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or "?")
        return TensorSpec(value.name, np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type)), tuple(dims))

    return ModelSignature(
        inputs=tuple(spec(v) for v in model.graph.input if v.name not in initializers),
        outputs=tuple(spec(v) for v in model.graph.output),
    )
