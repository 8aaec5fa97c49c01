"""Mixed-precision Keras models (``mixed_float16``): their ONNX graph computes in float16 between Casts.

tf2onnx converts such a model faithfully: Casts to float16 after the input, float16 weights (the
float32 variables' casts folded), float16 kernels, a Cast back to float32 before a float32 output
layer. That graph can neither be converted to FP16 again (onnxconverter-common refuses a model
that already has float16 tensors) nor quantized per channel (the quantizer sees Casts, not weights).

So the published FP32 model is the same graph computing in float32: every Cast to float16 becomes
an Identity, float16 weights and constants are widened to float32 (their values are the float16
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


def computes_in_float16(model: onnx.ModelProto) -> bool:
    """True when the graph casts to float16 or holds float16 weights (a mixed-precision model)."""
    from onnx import TensorProto

    casts = any(n.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.FLOAT16 for a in n.attribute) for n in model.graph.node)
    return casts or any(i.data_type == TensorProto.FLOAT16 for i in model.graph.initializer)


def float32_from_mixed(model: onnx.ModelProto) -> bool:
    """Rewrite a float16-computing graph in place to compute in float32 (see the module docstring);
    mark it in ``metadata_props``. Returns False (and changes nothing) for other graphs."""
    from onnx import TensorProto, numpy_helper

    if not computes_in_float16(model):
        return False
    graph = model.graph
    for node in graph.node:
        if node.op_type == "Cast" and any(a.name == "to" and a.i in (TensorProto.FLOAT16, TensorProto.FLOAT) for a in node.attribute):
            node.op_type = "Identity"  # float16 → float32 and back are both identities once everything is float32
            del node.attribute[:]
        for attribute in node.attribute:
            if attribute.HasField("t") and attribute.t.data_type == TensorProto.FLOAT16:
                attribute.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attribute.t).astype(np.float32), attribute.t.name))
    for i, init in enumerate(graph.initializer):
        if init.data_type == TensorProto.FLOAT16:
            graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    _keep_float16_interface(graph)
    del graph.value_info[:]  # stale float16 types; ONNX Runtime infers them again
    entry = model.metadata_props.add()
    entry.key, entry.value = MIXED_KEY, "float16"
    log.warning("the model computes in float16 (mixed precision): model.fp32.onnx computes in float32 (its Casts to float16 removed, "
                "float16 weights widened); FP16 and INT8 are made from it, and parity with TensorFlow uses the FP16 tolerance")
    return True


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
