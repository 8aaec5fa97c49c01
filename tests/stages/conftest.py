"""Tiny real ONNX models and data for the precision-stage tests (built with onnx.helper, no TF).

``digits_convnet`` is a small conv net that really classifies scikit-learn's 8×8 digits: random
3×3 conv filters + ReLU + max-pool as features, and a softmax head fitted by ridge regression
on one-hot labels (≈2 s, mostly importing scikit-learn), exported with the default model's I/O (``image`` NHWC → ``probs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def save_model(
    path: Path,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: dict[str, np.ndarray] | None = None,
) -> Path:
    """Check and save a one-graph model at opset 17."""
    graph = helper.make_graph(
        nodes, "test", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def tensor(name: str, elem_type: int, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


@pytest.fixture
def onnx_file():
    """``save_model(path, nodes, inputs, outputs, initializers)``: check and save a small model.
    (A fixture, not an import: test modules here are not a package, so ``conftest`` is ambiguous.)"""
    return save_model


@dataclass(frozen=True)
class Digits:
    model: Path  # FP32 ONNX: image float32 [batch,8,8,1] -> probs float32 [batch,10]
    calib: Path  # calib.npz: image [n,8,8,1]
    eval_images: np.ndarray
    eval_labels: np.ndarray
    fp32_accuracy: float


def _features_nodes(conv_w: np.ndarray) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    nodes = [
        helper.make_node("Transpose", ["image"], ["nchw"], perm=[0, 3, 1, 2], name="to_nchw"),
        helper.make_node("Conv", ["nchw", "conv_w", "conv_b"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("MaxPool", ["relu"], ["pool"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Flatten", ["pool"], ["features"], axis=1, name="flatten"),
    ]
    return nodes, {"conv_w": conv_w, "conv_b": np.full(conv_w.shape[0], 0.05, np.float32)}


@pytest.fixture(scope="session")
def digits_convnet(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    import onnxruntime as ort
    from sklearn.datasets import load_digits

    folder = tmp_path_factory.mktemp("digits")
    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0)[..., None]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    train, held = order[:1300], order[1300:]

    rng = np.random.default_rng(1)
    conv_w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    nodes, inits = _features_nodes(conv_w)
    image = tensor("image", TensorProto.FLOAT, ["batch", 8, 8, 1])
    features_model = save_model(folder / "features.onnx", nodes, [image], [tensor("features", TensorProto.FLOAT, ["batch", 128])], inits)
    session = ort.InferenceSession(str(features_model), providers=["CPUExecutionProvider"])
    features = session.run(None, {"image": images[train]})[0]
    design = np.hstack([features, np.ones((len(features), 1), np.float32)])
    onehot = np.eye(10, dtype=np.float32)[labels[train]]
    solution = np.linalg.solve(design.T @ design + 1.0 * np.eye(design.shape[1]), design.T @ onehot)
    solution *= 10.0  # sharpen the scores so the softmax gives confident probabilities

    inits.update(head_w=solution[:-1].astype(np.float32), head_b=solution[-1].astype(np.float32))
    nodes += [
        helper.make_node("Gemm", ["features", "head_w", "head_b"], ["logits"], name="head"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
    ]
    model = save_model(folder / "model.onnx", nodes, [image], [tensor("probs", TensorProto.FLOAT, ["batch", 10])], inits)
    calib = folder / "calib.npz"
    np.savez(calib, image=images[train[:256]])
    probs = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"image": images[held]})[0]
    accuracy = float((probs.argmax(1) == labels[held]).mean())
    return Digits(model, calib, images[held], labels[held], accuracy)
