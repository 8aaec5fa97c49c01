"""Keras models as users bring them, end to end through ``build``: exact GELU (``activation="gelu"``,
Erfc in TensorFlow) and Keras 2 / tf-keras files (HDF5 ``.h5`` and legacy SavedModel folders)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import cli

pytestmark = pytest.mark.slow


def _tabular(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """6 features, 3 classes: the class is the argmax of a fixed linear map (drawn from ``rng`` first)."""
    weights = np.random.default_rng(99).normal(size=(6, 3))
    x = rng.normal(size=(n, 6)).astype(np.float32)
    return x, (x @ weights).argmax(1).astype(np.int64)


def write_tabular_data(folder: Path, *, calib: int = 256, evaluate: int = 2000) -> tuple[Path, Path]:
    """calib.npz (features) and eval.npz (features, labels) for the 6-feature task."""
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "calib.npz", features=_tabular(rng, calib)[0])
    x, y = _tabular(rng, evaluate)
    np.savez(folder / "eval.npz", features=x, labels=y)
    return folder / "calib.npz", folder / "eval.npz"


def trained_gelu_classifier(keras_module: object) -> object:
    """Two exact-GELU Dense layers → 3-class softmax, trained for a few seconds on the tabular task
    (``keras_module``: Keras 3 or tf_keras, which share this API)."""
    keras = keras_module
    keras.utils.set_random_seed(5)  # type: ignore[attr-defined]
    x_in = keras.Input((6,), name="features")  # type: ignore[attr-defined]
    h = keras.layers.Dense(32, activation="gelu")(x_in)  # type: ignore[attr-defined]
    h = keras.layers.Dense(32, activation="gelu")(h)  # type: ignore[attr-defined]
    model = keras.Model(x_in, keras.layers.Dense(3, activation="softmax", name="probs")(h))  # type: ignore[attr-defined]
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x, y = _tabular(np.random.default_rng(2), 4000)
    model.fit(x, y, epochs=10, batch_size=64, verbose=0)
    return model


def test_exact_gelu_model_builds_fp16_and_int8_with_parity_against_tensorflow(tmp_path: Path) -> None:
    import keras

    trained_gelu_classifier(keras).save(tmp_path / "gelu.keras")  # type: ignore[attr-defined]
    calib, evaluate = write_tabular_data(tmp_path / "data")
    proc = cli("build", "--model", str(tmp_path / "gelu.keras"), "--fp16", "--int8", "--calibration", str(calib), "--eval-data", str(evaluate),
               "--workdir", str(tmp_path / "build"), "--repository", str(tmp_path / "repo"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ws = tmp_path / "build" / "gelu"
    parity = json.loads((ws / "parity.json").read_text())
    assert parity["passed"] and parity["outputs"]["probs"]["max_abs"] <= 1e-5, parity
    ops = [n.op_type for n in onnx.load(str(ws / "model.fp32.onnx")).graph.node]
    assert ops.count("Erf") == 2 and "Erfc" not in ops
    variants = json.loads((ws / "accuracy.json").read_text())["variants"]
    assert {v["variant"]: v["passed"] for v in variants} == {"fp16-onnx": True, "int8-onnx": True, "int8cpu-onnx": True}, variants
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["gelu_fp16", "gelu_fp32", "gelu_int8", "gelu_int8cpu"]
