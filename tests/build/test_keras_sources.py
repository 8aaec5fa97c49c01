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


def _tf_keras_h5(folder: Path, *, raw_tf_ops: bool = False, lambda_layer: bool = False) -> Path:
    """A trained 6-feature classifier written by tf-keras as HDF5. ``raw_tf_ops``: a raw ``tf.*`` call in
    the functional graph (tf-keras stores it as a TFOpLambda layer, which Keras 3 cannot rebuild);
    ``lambda_layer``: a ``Lambda`` layer (Python bytecode in the file)."""
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(6)
    x_in = tf_keras.Input((6,), name="features")
    h = tf_keras.layers.Dense(32, activation="gelu")(x_in)
    if raw_tf_ops:
        h = tf.math.softplus(h) * 0.5
    if lambda_layer:
        h = tf_keras.layers.Lambda(lambda t: t * 2.0, name="double")(h)
    model = tf_keras.Model(x_in, tf_keras.layers.Dense(3, activation="softmax", name="probs")(h))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x, y = _tabular(np.random.default_rng(2), 2000)
    model.fit(x, y, epochs=3, batch_size=64, verbose=0)
    path = folder / ("tfop.h5" if raw_tf_ops else "lambda.h5" if lambda_layer else "keras2.h5")
    model.save(path)
    return path


@pytest.mark.parametrize("raw_tf_ops", [False, True], ids=["keras3-reads-it", "only-tf-keras-reads-it"])
def test_tf_keras_h5_builds_with_parity(raw_tf_ops: bool, tmp_path: Path) -> None:
    """A tf-keras HDF5 file builds: through Keras 3 where it reads the file, else through tf-keras (TFOpLambda)."""
    h5 = _tf_keras_h5(tmp_path, raw_tf_ops=raw_tf_ops)
    calib, evaluate = write_tabular_data(tmp_path / "data", evaluate=256)
    proc = cli("build", "--model", str(h5), "--calibration", str(calib), "--eval-data", str(evaluate),
               "--workdir", str(tmp_path / "build"), "--repository", str(tmp_path / "repo"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ws = tmp_path / "build" / h5.stem
    parity = json.loads((ws / "parity.json").read_text())
    assert parity["passed"] and parity["outputs"]["probs"]["max_abs"] <= 1e-5, parity
    described = json.loads((ws / "savedmodel" / "assets.extra" / "pipeline_outputs.json").read_text())
    assert [(d["name"], d["activation"], d["loss"]) for d in described] == [("probs", "softmax", "sparse_categorical_crossentropy")]
    assert "trained with sparse_categorical_crossentropy" in proc.stderr  # the output kind comes from the file's training config


def test_h5_lambda_is_refused_without_the_flag_and_loads_with_it(tmp_path: Path) -> None:
    from pipeline.core.errors import PipelineError
    from pipeline.stages.source import keras_model_from_source, model_source
    from tests.conftest import one_line_error

    h5 = _tf_keras_h5(tmp_path, lambda_layer=True)
    line = one_line_error(cli("build", "--model", str(h5), "--workdir", str(tmp_path / "build")))
    assert line == (f"error: '{h5}' has Lambda layer(s) double, whose Python code loading would run — pass --allow-lambda only if you "
                    "trust where the file comes from, or replace the Lambda layers with registered custom layers")
    with pytest.raises(PipelineError, match="has Lambda layer"):
        model_source(str(h5))
    model = keras_model_from_source(model_source(str(h5), allow_lambda=True))
    x = np.random.default_rng(3).normal(size=(4, 6)).astype(np.float32)
    assert np.asarray(model(x)).shape == (4, 3)


def test_h5_that_needs_tf_keras_names_the_extra_when_it_is_missing(tmp_path: Path) -> None:
    """tf-keras is installed here, so its absence is staged: a ``tf_keras`` module that raises ImportError
    first on the build's PYTHONPATH (what Python sees when the package is not installed)."""
    from tests.conftest import ROOT, one_line_error

    h5 = _tf_keras_h5(tmp_path, raw_tf_ops=True)
    (tmp_path / "missing").mkdir()
    (tmp_path / "missing" / "tf_keras.py").write_text("raise ImportError(\"No module named 'tf_keras'\")\n")
    line = one_line_error(cli("build", "--model", str(h5), "--workdir", str(tmp_path / "build"), env={"PYTHONPATH": f"{tmp_path / 'missing'}:{ROOT}"}))
    assert line.startswith(f"error: Keras 3 cannot load the Keras 2 file '{h5}' (Unknown layer: 'TFOpLambda'"), line
    assert "it needs tf-keras (the 'keras2' extra), which is not installed — pip install --no-deps 'tf-keras" in line, line


def test_legacy_tf_keras_savedmodel_converts_as_a_savedmodel_without_running_its_lambda(tmp_path: Path) -> None:
    """A tf-keras SavedModel folder (model.save('dir') in Keras 2) is TensorFlow's graph: it converts
    without tf-keras and without deserialising its Lambda layer's Python code."""
    import tf_keras

    from pipeline.accuracy.evaldata import synthetic_eval_data
    from pipeline.data.tensors import signature_from_onnx
    from pipeline.stages.onnx_export import MIN_OPSET, onnx_from_savedmodel
    from pipeline.stages.parity import parity_report_from_models
    from pipeline.stages.source import model_source

    model = tf_keras.models.load_model(_tf_keras_h5(tmp_path, lambda_layer=True), compile=False)  # the test's own file
    model.save(tmp_path / "legacy")
    assert (tmp_path / "legacy" / "keras_metadata.pb").is_file()
    assert model_source(str(tmp_path / "legacy")).kind == "savedmodel"
    onnx_path = onnx_from_savedmodel(tmp_path / "legacy", tmp_path / "model.onnx", MIN_OPSET)
    data = synthetic_eval_data(signature_from_onnx(onnx_path), 64)
    report = json.loads(parity_report_from_models(tmp_path / "legacy", onnx_path, data, tmp_path / "parity.json", atol=1e-5, rtol=1e-4, batch_size=16).read_text())
    assert report["passed"], report
