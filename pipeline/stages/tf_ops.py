"""TensorFlow ops tf2onnx 1.17 has no handler for, converted here; and which opset would convert an op.

Imported by the conversion driver (:mod:`pipeline.stages.tf2onnx_run`) before it converts, so the
handlers below join tf2onnx's own through its handler registry (``tf2onnx.handler.tf_op``, the
decorator tf2onnx's built-in handlers use): the stage's reproduce command,
``python -m pipeline.stages.tf2onnx_run ...``, converts with them too. Plain
``python -m tf2onnx.convert`` cannot load them and stops at these ops.

- ``Erfc``: exact GELU (``keras.activations.gelu(approximate=False)``, the Keras default, so every
  ``activation="gelu"``) lowers to ``0.5·x·erfc(-x/√2)`` in TensorFlow. ONNX has no Erfc but has
  ``Erf`` since opset 9, and erfc(x) = 1 − erf(x). The 1 − erf form loses precision only where
  erfc(x) is tiny (x ≳ 3), where GELU multiplies it by 0.5·x·… of a large negative x and the
  absolute error stays below float32's step near 1 (6e-8), far under the parity tolerance.

Importing this module imports tf2onnx, and with it TensorFlow: only the conversion child does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tf2onnx import constants, utils
from tf2onnx.handler import tf_op

NEWEST_OPSET = max(constants.OPSET_TO_IR_VERSION)  # the newest opset tf2onnx 1.17 can target


@tf_op("Erfc")
class Erfc:
    """``Erfc(x)`` → ``Sub(1, Erf(x))`` in the input's float type."""

    @classmethod
    def version_9(cls, ctx: Any, node: Any, **kwargs: Any) -> None:
        x = node.input[0]
        dtype = ctx.get_dtype(x)
        one = ctx.make_const(utils.make_name(f"{node.name}/one"), np.array(1, dtype=utils.map_onnx_to_numpy_type(dtype)))
        erf = ctx.make_node("Erf", [x], op_name_scope=node.name, shapes=[ctx.get_shape(x)], dtypes=[dtype])
        node.type = "Sub"
        ctx.replace_inputs(node, [one.output[0], erf.output[0]])


def lowest_opsets(ops: list[str]) -> dict[str, int | None]:
    """For each TensorFlow op type, the lowest ONNX opset at which tf2onnx (with the handlers above)
    converts it, or None where no opset up to :data:`NEWEST_OPSET` does."""
    import tf2onnx.onnx_opset  # noqa: F401  (registers tf2onnx's own handlers)

    versions = tf_op.get_opsets().get(constants.ONNX_DOMAIN, [])
    return {op: next((v for v, handlers in enumerate(versions) if op in handlers and v <= NEWEST_OPSET), None) for op in ops}
