"""The newest ONNX IR version and ``ai.onnx`` opset the installed ONNX Runtime loads.

How ``ONNXRUNTIME_LIMITS`` in ``pipeline/triton/ngc_releases.py`` was measured: for each ONNX
Runtime an NGC Triton release ships, install that version from PyPI into a scratch virtualenv
(``pip install onnxruntime==1.22.0 onnx``) and run this script there. It writes one-node (``Relu``)
models stamped with each (opset, IR version) pair and tries to open each one; ONNX Runtime refuses
an opset or an IR version newer than its own at load time, so the largest pair that opens is its
limit. The printed line is ``<onnxruntime version> <max IR> <max opset>``.

    python scripts/ort_limits.py            # e.g. "1.22.0 10 22"
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

OPSETS = range(7, 41)
IR_VERSIONS = range(3, 21)


def _model(opset: int, ir_version: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def _loads(model: onnx.ModelProto, path: Path) -> bool:
    path.write_bytes(model.SerializeToString())
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any load failure means "not supported" here
        return False
    return True


def limits() -> tuple[int, int]:
    """(max IR version, max opset) of the installed ONNX Runtime, each probed with the other held low."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.onnx"
        max_opset = max(o for o in OPSETS if _loads(_model(o, 7), path))
        max_ir = max(i for i in IR_VERSIONS if _loads(_model(7, i), path))
    return max_ir, max_opset


if __name__ == "__main__":
    ort.set_default_logger_severity(3)
    ir, opset = limits()
    print(ort.__version__, ir, opset)
