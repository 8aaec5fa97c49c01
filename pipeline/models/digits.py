"""The bundled default model: a small Keras CNN on scikit-learn's 8×8 digits (ships offline).

Deterministic: the split is a fixed permutation (seed 0), training uses fixed seeds and op
determinism, so every machine trains the same weights. The evaluation split (held out) and a
calibration split (drawn from the training data, as calibration should be) are written to
``calibration/digits/`` by ``python -m pipeline.models.digits``; the build reads them there.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import keras

NAME = "digits"
INPUT = "image"
OUTPUT = "probs"
LABELS = [str(i) for i in range(10)]
EVAL_FRACTION = 0.25
CALIBRATION_SAMPLES = 512
SEED = 0


def splits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``train``, ``eval`` and ``calib`` splits as (images [n,8,8,1] float32 in 0..1, labels int64)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0)[..., None]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(labels))
    n_eval = int(len(labels) * EVAL_FRACTION)
    eval_idx, train_idx = order[:n_eval], order[n_eval:]
    calib_idx = train_idx[:CALIBRATION_SAMPLES]
    return {
        "train": (images[train_idx], labels[train_idx]),
        "eval": (images[eval_idx], labels[eval_idx]),
        "calib": (images[calib_idx], labels[calib_idx]),
    }


def untrained_model() -> "keras.Model":
    """The architecture: two conv blocks and a dense softmax head (input ``image``, output ``probs``)."""
    import keras

    inputs = keras.Input((8, 8, 1), name=INPUT)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name=OUTPUT)(x)
    return keras.Model(inputs, outputs, name=NAME)


def trained_model(epochs: int = 30) -> "keras.Model":
    """Train the default model deterministically (≈10–20 s on 2 cores)."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    model = untrained_model()
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = splits()["train"]
    model.fit(x, y, batch_size=64, epochs=epochs, shuffle=True, verbose=0)
    return model


def write_data(folder: Path) -> list[Path]:
    """Write ``eval.npz`` (image + labels) and ``calib.npz`` (image) and ``labels.txt`` to ``folder``."""
    from pipeline.data.workspace import ModelData

    data = ModelData(folder)
    folder.mkdir(parents=True, exist_ok=True)
    parts = splits()
    eval_x, eval_y = parts["eval"]
    calib_x, _ = parts["calib"]
    np.savez_compressed(data.eval, **{INPUT: eval_x, "labels": eval_y})
    np.savez_compressed(data.calib, **{INPUT: calib_x})
    data.labels.write_text("\n".join(LABELS) + "\n")
    return [data.eval, data.calib, data.labels]


def write_image_folder(folder: Path, count: int | None = None) -> Path:
    """The evaluation digits as PNG files of assorted sizes, one sub-folder per class (``folder/<label>/<i>.png``):
    each 8×8 image scaled to 0..255 and enlarged with PIL's bicubic filter to a side of 16 to 48 pixels (width and
    height drawn apart, within 1.1× of square), as a scanner would give them. Deterministic (seed 0)."""
    from PIL import Image

    images, labels = splits()["eval"]
    rng = np.random.default_rng(SEED)
    for i, (image, label) in enumerate(zip(images[:count], labels[:count], strict=False)):
        height = int(rng.integers(16, 49))
        width = int(np.clip(round(height * rng.uniform(0.92, 1.08)), 16, 48))
        pixels = Image.fromarray(np.round(image[..., 0] * 255).astype(np.uint8), mode="L")
        target = folder / LABELS[int(label)] / f"{i:04d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        pixels.resize((width, height), Image.Resampling.BICUBIC).save(target)
    return folder


if __name__ == "__main__":
    import sys

    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("calibration") / NAME
    for path in write_data(target):
        sys.stdout.write(f"wrote {path}\n")
