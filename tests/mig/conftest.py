"""Shared fixtures for the MIG tests: the recorded nvidia-smi outputs and tiny ONNX models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# Recorded on a real H200 (see tests/fixtures/README.md); part of the repository, so no test skips for want of them.
FIXTURES = REPO_ROOT / "tests" / "fixtures"

# Hand-written from the documented `nvidia-smi -L` format (NVIDIA MIG User Guide, "Getting
# Started with MIG"): an H200 with the layout 3x2g.35gb + 1x1g.18gb. UUIDs are made up.
NVIDIA_SMI_L_H200 = """\
GPU 0: NVIDIA H200 (UUID: GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901)
  MIG 2g.35gb     Device  0: (UUID: MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c4d)
  MIG 2g.35gb     Device  1: (UUID: MIG-1b2c3d4e-5f6a-5b7c-9d8e-0f1a2b3c4d5e)
  MIG 2g.35gb     Device  2: (UUID: MIG-2c3d4e5f-6a7b-5c8d-8e9f-1a2b3c4d5e6f)
  MIG 1g.18gb     Device  3: (UUID: MIG-3d4e5f6a-7b8c-5d9e-9f0a-2b3c4d5e6f7a)
"""


@pytest.fixture
def fixtures_dir() -> Path:
    """tests/fixtures: the recorded nvidia-smi outputs."""
    return FIXTURES


def tiny_mlp(path: Path) -> Path:
    """image [batch,16] → MatMul 16x32 → Relu → MatMul 32x10 → Softmax → probs [batch,10]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])
    w1 = numpy_helper.from_array(np.full((16, 32), 0.01, np.float32), "w1")
    w2 = numpy_helper.from_array(np.full((32, 10), 0.01, np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["image", "w1"], ["hidden"]),
        helper.make_node("Relu", ["hidden"], ["relu"]),
        helper.make_node("MatMul", ["relu", "w2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def tiny_onnx(tmp_path: Path) -> Path:
    return tiny_mlp(tmp_path / "tiny.onnx")
