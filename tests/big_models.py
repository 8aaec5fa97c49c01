"""Recommender-style Keras models of any size, made without training: int32 item ids → an embedding table that is
nearly all of the weights → mean pooling → two Dense layers → 10 classes.

Item ``r`` belongs to genre ``r % 10``; its row is the genre's prototype plus a closed form of ``r``
(``table_rows``). A sample is 8 items of one genre, and the last layer is solved so that each genre's mean row
scores its genre by a wide margin: answers are decisive, as a trained model's are. The labels are the model's
own answers, computed in NumPy from the rows the evaluation ids touch: a 2 GB model needs no second copy. Specs for
``--model``: ``tests.big_models:recommender_<size>`` (``small`` 0.5 MB, ``100m`` 0.1 GB, ``1g``, ``2g2``, ``2g5``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DIM, HIDDEN, CLASSES, IDS = 1024, 64, 10, 8
_CHUNK = 16384  # rows written per assign: the table is never held twice


def rows_for(gigabytes: float, dim: int = DIM) -> int:
    """Rows of a float32 table of ``dim`` columns holding ``gigabytes`` (10⁹ bytes)."""
    return int(gigabytes * 1e9) // (dim * 4)


def _prototypes(dim: int) -> np.ndarray:
    return np.random.default_rng(5).normal(0, 1, (CLASSES, dim))


def table_rows(rows: np.ndarray, dim: int = DIM) -> np.ndarray:
    """Rows ``rows`` of the embedding table: the genre's prototype + ``0.5·sin(r·a + b)`` (fixed a, b), float32."""
    rng = np.random.default_rng(1234)
    freq, phase = rng.uniform(0.001, 3.0, dim), rng.uniform(0, 2 * np.pi, dim)
    noise = 0.5 * np.sin(np.outer(rows.astype(np.float64), freq) + phase)
    return (_prototypes(dim)[rows % CLASSES] + noise).astype(np.float32)


def _dense_weights(dim: int) -> list[np.ndarray]:
    rng = np.random.default_rng(99)
    k1 = rng.normal(0, 1.0 / np.sqrt(dim), (dim, HIDDEN))
    b1 = rng.normal(0, 0.1, HIDDEN)
    hidden = np.maximum(_prototypes(dim) @ k1 + b1, 0)  # each genre's mean row, through the first layer
    k2 = np.linalg.lstsq(hidden, 6.0 * np.eye(CLASSES), rcond=None)[0]  # scores its own genre 6, the others 0
    return [k1.astype(np.float32), b1.astype(np.float32), k2.astype(np.float32), np.zeros(CLASSES, np.float32)]


def recommender(rows: int, dim: int = DIM):  # type: ignore[no-untyped-def]
    """The Keras model with a ``rows`` × ``dim`` table (see the module docstring)."""
    import keras

    ids = keras.Input((IDS,), name="item_ids", dtype="int32")
    table = keras.layers.Embedding(rows, dim, embeddings_initializer="zeros", name="items")
    h = keras.layers.GlobalAveragePooling1D()(table(ids))
    h = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(h)
    model = keras.Model(ids, keras.layers.Dense(CLASSES, activation="softmax", name="scores")(h))
    variable = table.embeddings
    for start in range(0, rows, _CHUNK):
        stop = min(rows, start + _CHUNK)
        variable[start:stop].assign(table_rows(np.arange(start, stop), dim))
    k1, b1, k2, b2 = _dense_weights(dim)
    model.get_layer("hidden").set_weights([k1, b1])
    model.get_layer("scores").set_weights([k2, b2])
    return model


def answers(ids: np.ndarray, dim: int = DIM) -> np.ndarray:
    """The model's class probabilities for ``ids``, computed in NumPy (float64) from the rows they touch."""
    k1, b1, k2, b2 = (w.astype(np.float64) for w in _dense_weights(dim))
    pooled = table_rows(ids.reshape(-1), dim).astype(np.float64).reshape(*ids.shape, dim).mean(axis=1)
    logits = np.maximum(pooled @ k1 + b1, 0) @ k2 + b2
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def sample_ids(rng: np.random.Generator, samples: int, rows: int) -> np.ndarray:
    """``samples`` × 8 item ids, each sample's of one random genre."""
    genres = rng.integers(0, CLASSES, (samples, 1))
    return (genres + CLASSES * rng.integers(0, rows // CLASSES, (samples, IDS))).astype(np.int32)


def write_data(folder: Path, rows: int, eval_samples: int = 300, calib_samples: int = 256, dim: int = DIM) -> tuple[Path, Path]:
    """``calib.npz`` (ids) and ``eval.npz`` (ids and the model's own top-1 as labels) in ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    calib_ids, eval_ids = sample_ids(rng, calib_samples, rows), sample_ids(rng, eval_samples, rows)
    calib, evaluation = folder / "calib.npz", folder / "eval.npz"
    np.savez(calib, item_ids=calib_ids)
    np.savez(evaluation, item_ids=eval_ids, labels=answers(eval_ids, dim).argmax(axis=1).astype(np.int64))
    return calib, evaluation


SMALL_ROWS, SMALL_DIM = 2000, 64


def recommender_small():  # type: ignore[no-untyped-def]
    return recommender(SMALL_ROWS, SMALL_DIM)


def recommender_100m():  # type: ignore[no-untyped-def]
    return recommender(rows_for(0.1))


def recommender_1g():  # type: ignore[no-untyped-def]
    return recommender(rows_for(1.0))


def recommender_2g2():  # type: ignore[no-untyped-def]
    return recommender(rows_for(2.2))  # 2.2 GB: past protobuf's 2**31 bytes


def recommender_2g5():  # type: ignore[no-untyped-def]
    return recommender(rows_for(2.5))
