"""Models as users bring them to ``build --int8``: each trained for seconds on its own synthetic task, with a data
generator for its calibration and labelled evaluation sets (``DATA[name](samples, seed)`` → arrays for an .npz).

The kinds that failed ``build --int8`` on an AVX2-only CPU before the CPU INT8 variant got 7-bit weights and became
optional: a classifier with a custom activation layer, a two-head detector (class + box), a price regressor, a
``model.export()`` binary classifier, a GRU forecaster, a token classifier and a 12-feature tabular classifier; plus
``outlier_classifier``, whose first layer reads one feature of a huge range (quantization-hostile on purpose).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

Arrays = dict[str, np.ndarray]


def _seeded(seed: int) -> None:
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


def _fit(model: keras.Model, x: object, y: object, loss: object, epochs: int) -> keras.Model:
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=loss)
    model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, shuffle=False)
    return model


# ---- data ------------------------------------------------------------------------------------------------------------

def digits_data(n: int, seed: int) -> Arrays:
    """sklearn's 8×8 digits (0..1), drawn with replacement, with light pixel noise."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(digits.target), n)
    images = digits.images[index] / 16.0 + rng.normal(0, 0.03, (n, 8, 8))
    return {"image": images[..., None].astype(np.float32), "labels": digits.target[index].astype(np.int64)}


def boxes_data(n: int, seed: int) -> Arrays:
    """16×16 images with one bright square: class = its size (small/medium/large), box = (x, y, w, h) / 16."""
    rng = np.random.default_rng(seed)
    images = rng.normal(0, 0.05, (n, 16, 16, 1)).astype(np.float32)
    classes = rng.integers(0, 3, n)
    boxes = np.zeros((n, 4), np.float32)
    for i, c in enumerate(classes):
        size = (3, 6, 9)[c]
        x, y = rng.integers(0, 16 - size, 2)
        images[i, y:y + size, x:x + size, 0] += 1.0
        boxes[i] = (x / 16, y / 16, size / 16, size / 16)
    return {"image": images, "labels:class_probs": classes.astype(np.int64), "labels:box": boxes}


def price_data(n: int, seed: int) -> Arrays:
    """Ten features of a house (area, rooms, age, …, standardized) → price in thousands."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 10)).astype(np.float32)
    price = 300 + 80 * x[:, 0] + 40 * x[:, 1] - 25 * x[:, 2] + 30 * np.tanh(x[:, 3] * x[:, 4]) + 10 * x[:, 5] ** 2 + rng.normal(0, 5, n)
    return {"features": x, "labels": price.astype(np.float32)[:, None]}


def churn_data(n: int, seed: int) -> Arrays:
    """Six customer features → churned (0/1)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    logit = 1.5 * x[:, 0] - x[:, 1] + 0.8 * x[:, 2] * x[:, 3] + 0.5
    return {"inputs": x, "labels": (rng.random(n) < 1 / (1 + np.exp(-2 * logit))).astype(np.int64)}


def series_data(n: int, seed: int) -> Arrays:
    """24 steps of a noisy seasonal series → the next value."""
    rng = np.random.default_rng(seed)
    t = np.arange(25)[None, :] + rng.uniform(0, 24, (n, 1))
    amplitude, level = rng.uniform(0.5, 2.0, (n, 1)), rng.normal(0, 1, (n, 1))
    series = level + amplitude * np.sin(2 * np.pi * t / 12) + rng.normal(0, 0.05, (n, 25))
    return {"window": series[:, :24, None].astype(np.float32), "labels": series[:, 24:].astype(np.float32)}


VOCAB, TAGS, TOKENS = 60, 4, 16


def tokens_data(n: int, seed: int) -> Arrays:
    """16 token ids per sample → a tag per token: the tag of a token is its id's group, except after token 1 (a marker)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, VOCAB, (n, TOKENS))
    ids[rng.random((n, TOKENS)) < 0.1] = 1
    tags = (ids % 3).astype(np.int64)
    tags[:, 1:][ids[:, :-1] == 1] = 3
    return {"ids": ids.astype(np.int64), "labels": tags}


def tabular_data(n: int, seed: int) -> Arrays:
    """Twelve mixed-scale features (counts, amounts, ratios) → one of three segments."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.poisson(3, (n, 4)), rng.lognormal(3, 1, (n, 4)) / 20, rng.random((n, 4))], axis=1).astype(np.float32)
    score = np.stack([x[:, 0] - x[:, 4] + 2 * x[:, 8], x[:, 1] + x[:, 5] - x[:, 9], 0.5 * x[:, 2] + 2 * x[:, 10] + 1.0], axis=1)
    return {"features": x, "labels": np.argmax(score + rng.gumbel(0, 0.3, score.shape), axis=1).astype(np.int64)}


def outlier_data(n: int, seed: int) -> Arrays:
    """Sixteen features → three classes from features 1..15; feature 0 is a raw counter in the thousands that carries nothing."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 16)).astype(np.float32)
    for c in range(3):
        x[labels == c, 1 + 5 * c:6 + 5 * c] += 1.2  # each class raises its own five features
    x[:, 0] = rng.uniform(0, 5000, n)
    return {"features": x, "labels": labels.astype(np.int64)}


def _inputs(data: Arrays) -> Arrays:
    return {k: v for k, v in data.items() if not k.startswith("labels")}


def _labels(data: Arrays) -> object:
    labels = {k.partition(":")[2]: v for k, v in data.items() if k.startswith("labels:")}
    return labels or data["labels"]


# ---- models ----------------------------------------------------------------------------------------------------------

@keras.saving.register_keras_serializable(package="user_models")
class SoftClip(keras.layers.Layer):
    """A custom activation: x·sigmoid(1.7x) clipped softly at ±4 (a user's own layer class)."""

    def call(self, x):  # type: ignore[no-untyped-def]
        return 4.0 * keras.ops.tanh(x * keras.ops.sigmoid(1.7 * x) / 4.0)


def custom_activation_classifier() -> keras.Model:
    _seeded(11)
    x = keras.Input((8, 8, 1), name="image")
    h = SoftClip()(keras.layers.Conv2D(16, 3, padding="same")(x))
    h = keras.layers.MaxPooling2D()(h)
    h = SoftClip()(keras.layers.Conv2D(32, 3, padding="same")(h))
    h = keras.layers.GlobalAveragePooling2D()(h)
    h = SoftClip()(keras.layers.Dense(32)(h))
    model = keras.Model(x, keras.layers.Dense(10, activation="softmax", name="probs")(h))
    data = digits_data(1500, 0)
    return _fit(model, data["image"], data["labels"], "sparse_categorical_crossentropy", 12)


def two_head_detector() -> keras.Model:
    _seeded(12)
    x = keras.Input((16, 16, 1), name="image")
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.Dense(64, activation="relu")(keras.layers.Flatten()(h))
    model = keras.Model(x, [keras.layers.Dense(3, activation="softmax", name="class_probs")(h), keras.layers.Dense(4, name="box")(h)])
    data = boxes_data(4000, 0)
    return _fit(model, data["image"], [data["labels:class_probs"], data["labels:box"]], ["sparse_categorical_crossentropy", "mse"], 25)


def price_regressor() -> keras.Model:
    _seeded(13)
    x = keras.Input((10,), name="features")
    h = keras.layers.Dense(64, activation="relu")(keras.layers.Rescaling(1.0)(x))
    h = keras.layers.Dense(32, activation="relu")(h)
    model = keras.Model(x, keras.layers.Dense(1, name="price")(h))
    data = price_data(3000, 0)
    return _fit(model, data["features"], data["labels"], "mse", 30)


def churn_classifier() -> keras.Model:
    _seeded(14)
    x = keras.Input((6,), name="inputs")
    h = keras.layers.Dense(32, activation="relu")(x)
    h = keras.layers.Dense(16, activation="relu")(h)
    model = keras.Model(x, keras.layers.Dense(1, activation="sigmoid", name="churn")(h))
    data = churn_data(3000, 0)
    return _fit(model, data["inputs"], data["labels"], "binary_crossentropy", 15)


def export_churn_classifier(path: str) -> None:
    """``model.export(path)``: the SavedModel a user hands over instead of a .keras file."""
    churn_classifier().export(path, verbose=False)


def gru_forecaster() -> keras.Model:
    _seeded(15)
    x = keras.Input((24, 1), name="window")
    h = keras.layers.GRU(16)(x)
    h = keras.layers.Dense(16, activation="relu")(h)
    model = keras.Model(x, keras.layers.Dense(1, name="next")(h))
    data = series_data(2000, 0)
    return _fit(model, data["window"], data["labels"], "mse", 15)


def token_classifier() -> keras.Model:
    _seeded(16)
    x = keras.Input((TOKENS,), name="ids", dtype="int64")
    h = keras.layers.Embedding(VOCAB, 16)(x)
    h = keras.layers.Conv1D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.Dense(32, activation="relu")(h)
    model = keras.Model(x, keras.layers.Dense(TAGS, activation="softmax", name="tags")(h))
    data = tokens_data(2000, 0)
    return _fit(model, data["ids"], data["labels"], "sparse_categorical_crossentropy", 12)


def tabular_classifier() -> keras.Model:
    _seeded(17)
    x = keras.Input((12,), name="features")
    h = keras.layers.Dense(48, activation="relu")(keras.layers.BatchNormalization()(x))
    h = keras.layers.Dense(24, activation="relu")(h)
    model = keras.Model(x, keras.layers.Dense(3, activation="softmax", name="segment")(h))
    data = tabular_data(3000, 0)
    return _fit(model, data["features"], data["labels"], "sparse_categorical_crossentropy", 15)


def two_dense_classifier() -> keras.Model:
    """Two Dense layers on the twelve tabular features (normalized in the model): the smallest model the INT8 fallback
    meets, two quantized nodes, so it may keep at most one in float."""
    _seeded(21)
    x = keras.Input((12,), name="features")
    h = keras.layers.Dense(16, activation="relu")(keras.layers.BatchNormalization()(x))
    model = keras.Model(x, keras.layers.Dense(3, activation="softmax", name="segment")(h))
    data = tabular_data(3000, 0)
    return _fit(model, data["features"], data["labels"], "sparse_categorical_crossentropy", 15)


def outlier_classifier() -> keras.Model:
    """Reads the raw counter unscaled beside standardized features: its first layer's input range is thousands,
    so an 8-bit step of that input is ~20 and every other feature quantizes to 0 (the layer must stay float)."""
    _seeded(18)
    x = keras.Input((16,), name="features")
    h = keras.layers.Dense(32, activation="relu", name="first")(x)
    h = keras.layers.Dense(32, activation="relu", name="second")(h)
    model = keras.Model(x, keras.layers.Dense(3, activation="softmax", name="probs")(h))
    data = outlier_data(3000, 0)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    kernel = model.layers[1].kernel
    kernel.assign(np.concatenate([np.zeros((1, 32), np.float32), kernel.numpy()[1:]]))  # the counter starts ignored
    model.fit(data["features"], data["labels"], batch_size=32, epochs=20, verbose=0, shuffle=False)
    return model


def linear_regressor() -> keras.Model:
    """One Dense layer on ten features: the layer computes the graph output, which the CPU INT8 recipe keeps float,
    so that recipe finds nothing to quantize (the TensorRT INT8 graph quantizes its input)."""
    _seeded(19)
    x = keras.Input((10,), name="features")
    model = keras.Model(x, keras.layers.Dense(1, name="price")(x))
    data = price_data(2000, 0)
    return _fit(model, data["features"], data["labels"], "mse", 30)


# name → (module:function or None for a SavedModel made by export_*, data generator, evaluation samples)
USER_MODELS: dict[str, tuple[str, Callable[[int, int], Arrays], int]] = {
    "custom_activation_classifier": ("tests.user_models:custom_activation_classifier", digits_data, 600),
    "two_head_detector": ("tests.user_models:two_head_detector", boxes_data, 800),
    "price_regressor": ("tests.user_models:price_regressor", price_data, 800),
    "exported_churn": ("", churn_data, 1200),
    "gru_forecaster": ("tests.user_models:gru_forecaster", series_data, 800),
    "token_classifier": ("tests.user_models:token_classifier", tokens_data, 300),
    "tabular_classifier": ("tests.user_models:tabular_classifier", tabular_data, 488),
}


def write_data(folder: Path, generate: Callable[[int, int], Arrays], eval_samples: int, calib_samples: int = 512) -> tuple[Path, Path]:
    """The calibration (inputs only) and evaluation (inputs and labels) files of one model; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    calib, evaluation = folder / "calib.npz", folder / "eval.npz"
    np.savez(calib, **_inputs(generate(calib_samples, 1)))
    np.savez(evaluation, **generate(eval_samples, 2))
    return calib, evaluation
