"""Mixed-precision Keras models (``mixed_float16``): their ONNX graph computes in float16 between Casts.

tf2onnx converts such a model faithfully: Casts to float16 after the input, float16 weights (the
float32 variables' casts folded), float16 kernels, a Cast back to float32 before a float32 output
layer. That graph can neither be converted to FP16 again (onnxconverter-common refuses a model
that already has float16 tensors) nor quantized per channel (the quantizer sees Casts, not weights).

So the published FP32 model is the same graph computing in float32: every cast between float16 and
float32 becomes an Identity (a cast from integers to float16 casts to float32), float16 weights and constants are widened to float32 (their values are the float16
ones the model was trained with). FP16 and INT8 are then made from it like any other model, and
the parity gate compares it with TensorFlow's float16 computation at the FP16 tolerance.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

MIXED_KEY = "pipeline.mixed_precision"  # metadata_props of model.fp32.onnx: the graph was float16 inside


def narrow_format(model: onnx.ModelProto) -> str | None:
    """"float16" or "bfloat16" when the graph casts to that format or holds weights in it (a ``mixed_float16`` or
    ``mixed_bfloat16`` model); None for a float32 graph."""
    from onnx import TensorProto

    # bfloat16 first: tf2onnx casts a mixed_bfloat16 model's inputs to float16 beside its bfloat16 weights, and the
    # coarser format is what TensorFlow computed in
    for code, name in ((TensorProto.BFLOAT16, "bfloat16"), (TensorProto.FLOAT16, "float16")):
        casts = any(n.op_type == "Cast" and any(a.name == "to" and a.i == code for a in n.attribute) for n in model.graph.node)
        if casts or any(i.data_type == code for i in model.graph.initializer):
            return name
    return None


def computes_in_float16(model: onnx.ModelProto) -> bool:
    """True when the graph computes in float16 or bfloat16 between casts (a mixed-precision model)."""
    return narrow_format(model) is not None


def float32_from_mixed(model: onnx.ModelProto) -> bool:
    """Rewrite a float16-computing graph in place to compute in float32 (see the module docstring);
    mark it in ``metadata_props``. Returns False (and changes nothing) for other graphs."""
    from onnx import TensorProto, numpy_helper

    fmt = narrow_format(model)
    if fmt is None:
        return False
    narrow = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    graph = model.graph
    floats = _float_tensors(model)
    for node in graph.node:
        to = next((a for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None
        if to is not None and to.i in (*narrow, TensorProto.FLOAT) and node.input[0] in floats:
            node.op_type = "Identity"  # float ↔ float16/bfloat16 casts vanish once everything is float32
            del node.attribute[:]
        elif to is not None and to.i in narrow:
            to.i = TensorProto.FLOAT  # from integers: a conversion to float32 instead
        for attribute in node.attribute:
            if attribute.HasField("t") and attribute.t.data_type in narrow:
                attribute.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attribute.t).astype(np.float32), attribute.t.name))
    for i, init in enumerate(graph.initializer):
        if init.data_type in narrow:
            graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    _keep_float16_interface(graph)
    del graph.value_info[:]  # stale float16 types; ONNX Runtime infers them again
    entry = model.metadata_props.add()
    entry.key, entry.value = MIXED_KEY, fmt
    log.warning("the model computes in %s (mixed precision): model.fp32.onnx computes in float32 (its %s casts removed, weights "
                "widened); FP16 and INT8 are made from it, and parity with TensorFlow allows %s's spacing", fmt, fmt, fmt)
    return True


def _float_tensors(model: onnx.ModelProto) -> set[str]:
    """Names of the float32/float16 tensors of the graph, by ONNX shape inference (casts from them are identities)."""
    import onnx
    from onnx import TensorProto

    wanted = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
    inferred = onnx.shape_inference.infer_shapes(model).graph
    values = [*inferred.value_info, *inferred.input, *inferred.output]
    return {v.name for v in values if v.type.tensor_type.elem_type in wanted} | {i.name for i in inferred.initializer if i.data_type in wanted}


def _keep_float16_interface(graph: onnx.GraphProto) -> None:
    """float16 graph inputs and outputs stay float16 for clients: Casts at the edges of the float32 graph."""
    from onnx import TensorProto, helper

    for value in graph.input:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
            wide = f"{value.name}__float32"
            for node in graph.node:
                node.input[:] = [wide if name == value.name else name for name in node.input]
            graph.node.insert(0, helper.make_node("Cast", [value.name], [wide], to=TensorProto.FLOAT, name=f"{wide}_cast"))
    for value in graph.output:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
            wide = f"{value.name}__float32"
            for node in graph.node:
                node.output[:] = [wide if name == value.name else name for name in node.output]
                node.input[:] = [wide if name == value.name else name for name in node.input]
            graph.node.append(helper.make_node("Cast", [wide], [value.name], to=TensorProto.FLOAT16, name=f"{value.name}_cast"))


def was_mixed(model: onnx.ModelProto) -> bool:
    """Whether :func:`float32_from_mixed` rewrote this model."""
    return any(p.key == MIXED_KEY for p in model.metadata_props)


def mixed_format(model: onnx.ModelProto) -> str:
    """The format TensorFlow computed this model in: "float16" or "bfloat16" where :func:`float32_from_mixed` rewrote
    it (models rewritten before bfloat16 was known record "float16"), else "float32"."""
    return next((p.value or "float16" for p in model.metadata_props if p.key == MIXED_KEY), "float32")
