"""Small hand-written ONNX graphs that more than one test module needs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BIAS_W = np.array([2.0, 3.0], np.float32)  # per output channel
BIAS_B = np.array([0.6, -0.4], np.float32)


def bias_model(path: Path) -> Path:
    """x, w int8 with scale 1, float bias 0.6/-0.4 (BIAS_B), output requantized with scale 2: ONNX Runtime's optimizer
    rounds the bias to int32 first, which moves round((acc + b) / 2) for acc = 2 from 1 to 2; TensorRT and the exact
    session keep the bias in float. Input x: (batch, 1, 2, 2); output y: (batch, 2, 2, 2)."""
    consts = {"one": np.array(1.0, np.float32), "two": np.array(2.0, np.float32), "zp": np.array(0, np.int8),
              "w": BIAS_W.reshape(2, 1, 1, 1), "w_scale": np.ones(2, np.float32), "w_zp": np.zeros(2, np.int8), "b": BIAS_B}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "one", "zp"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "one", "zp"], ["xd"]),
        helper.make_node("QuantizeLinear", ["w", "w_scale", "w_zp"], ["wq"], axis=0),
        helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "b"], ["conv"]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("QuantizeLinear", ["relu", "two", "zp"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "two", "zp"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "bias", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, 2, 2])],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path
