"""The model zoo: everyday Keras model kinds at small input sizes, each with its own data.

Every entry is a ``module:function`` source for ``python -m pipeline build`` (``tests.zoo.models:resnet50``)
plus a generator of its calibration and evaluation arrays. Weights are random (seeded), so no
model has ground truth: evaluation labels are the FP32 Keras model's own top-1, which makes
accuracy "agreement with Keras" and each gate a measure of what a precision loses.

Sequence models come with two lengths (16 and 20) in length buckets (``tokens__16``,
``tokens__20``), so their profiles, calibration, gates and serving see more than one size.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

IMAGE = (32, 32, 3)
CLASSES = 10
SEQ_LENGTHS = (16, 20)
VOCAB = 200


def spread_head(model: keras.Model, x: np.ndarray, scale: float = 3.0) -> keras.Model:
    """Refit the last layer with a kernel (the classifier: Dense, or a 1×1 Conv) so the classes
    spread over the data: logits = the top principal components of its centred input features,
    whitened, times ``scale``. A random-weight backbone otherwise sends every input to one class,
    and a gate on a constant argmax measures nothing."""
    head = next(layer for layer in reversed(model.layers) if getattr(layer, "kernel", None) is not None)
    features = keras.Model(model.inputs, head.input).predict(x, batch_size=64, verbose=0).reshape(len(x), -1)
    mean = features.mean(0)
    _, sv, vt = np.linalg.svd(features - mean, full_matrices=False)
    classes = head.kernel.shape[-1]
    weights = (vt[:classes].T / np.maximum(sv[:classes], 1e-6) * np.sqrt(len(x)) * scale).astype(np.float32)
    head.kernel.assign(weights.reshape(head.kernel.shape))
    head.bias.assign(-(mean @ weights).astype(np.float32))
    return model


def _image_app(app: Callable[..., keras.Model], seed: int, draw: Callable[[np.random.Generator, int], np.ndarray]) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = app(weights=None, input_tensor=keras.Input(IMAGE, name="image"), classes=CLASSES)
    return spread_head(model, draw(np.random.default_rng(seed), 256))


def _normal_images(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.normal(size=(n, *IMAGE)).astype(np.float32)


def _pixel_images(rng: np.random.Generator, n: int, shape: tuple[int, ...] = IMAGE) -> np.ndarray:
    return (rng.random((n, *shape), dtype=np.float32) * 255).astype(np.float32)


def resnet50() -> keras.Model:
    """Keras Applications ResNet50, random weights (classifier spread over the data), 32×32×3, 10 classes."""
    return _image_app(keras.applications.ResNet50, 10, _normal_images)


def mobilenet_v3_small() -> keras.Model:
    """Keras Applications MobileNetV3Small (Rescaling inside, hard-swish, SE blocks), random weights, 32×32×3 pixels 0..255."""
    return _image_app(keras.applications.MobileNetV3Small, 11, _pixel_images)


def densenet121() -> keras.Model:
    """Keras Applications DenseNet121 (deep Concat chains), random weights, 32×32×3."""
    return _image_app(keras.applications.DenseNet121, 12, _normal_images)


class PositionEmbedding(keras.layers.Layer):
    """Token + learned position embeddings for any sequence length up to ``max_length``."""

    def __init__(self, vocab: int, max_length: int, dim: int, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(vocab, dim)
        self.positions = keras.layers.Embedding(max_length, dim)
        self.vocab, self.max_length, self.dim = vocab, max_length, dim

    def call(self, ids):  # type: ignore[no-untyped-def]
        length = keras.ops.shape(ids)[-1]
        return self.tokens(ids) + self.positions(keras.ops.arange(length))

    def get_config(self) -> dict:
        return {**super().get_config(), "vocab": self.vocab, "max_length": self.max_length, "dim": self.dim}


def transformer_classifier() -> keras.Model:
    """A Transformer encoder block over int32 token ids with a dynamic sequence axis → 4 classes."""
    keras.utils.set_random_seed(13)
    ids = keras.Input((None,), dtype="int32", name="tokens")
    x = PositionEmbedding(VOCAB, 64, 32)(ids)
    attn = keras.layers.MultiHeadAttention(num_heads=2, key_dim=16)(x, x)
    x = keras.layers.LayerNormalization()(x + attn)
    ffn = keras.layers.Dense(64, activation="relu")(x)  # exact gelu lowers to Erfc, which tf2onnx 1.17 cannot convert
    x = keras.layers.LayerNormalization()(x + keras.layers.Dense(32)(ffn))
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(ids, keras.layers.Dense(4, activation="softmax", name="probs")(x))


def lstm_classifier() -> keras.Model:
    """An LSTM over a dynamic time axis of 6 features → 3 classes."""
    keras.utils.set_random_seed(14)
    frames = keras.Input((None, 6), name="frames")
    x = keras.layers.LSTM(16)(frames)
    return keras.Model(frames, keras.layers.Dense(3, activation="softmax", name="probs")(x))


def preprocessing_cnn() -> keras.Model:
    """Preprocessing inside the model: raw 0..255 pixels → Rescaling → Normalization (fixed
    per-channel mean/variance) → a small CNN → 5 classes."""
    keras.utils.set_random_seed(15)
    pixels = keras.Input((16, 16, 3), name="pixels")
    x = keras.layers.Rescaling(1.0 / 255)(pixels)
    x = keras.layers.Normalization(mean=[0.5, 0.45, 0.4], variance=[0.08, 0.07, 0.09])(x)
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(pixels, keras.layers.Dense(5, activation="softmax", name="probs")(x))
    return spread_head(model, _pixel_images(np.random.default_rng(15), 256, (16, 16, 3)))


def two_heads() -> keras.Model:
    """Two inputs (an image and tabular features), two outputs: 4-class softmax and a regression value."""
    keras.utils.set_random_seed(16)
    image = keras.Input((16, 16, 3), name="image")
    features = keras.Input((5,), name="features")
    x = keras.layers.Conv2D(8, 3, strides=2, activation="relu")(image)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Concatenate()([x, keras.layers.Dense(8, activation="relu")(features)])
    x = keras.layers.Dense(16, activation="relu")(x)
    cls = keras.layers.Dense(4, activation="softmax", name="cls")(x)
    value = keras.layers.Dense(1, name="value")(x)
    return keras.Model([image, features], [cls, value])


# ----------------------------------------------------------------------------- data

Inputs = Callable[[np.random.Generator, int, int | None], dict[str, np.ndarray]]


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry: its source, how its inputs are drawn, and whether it has a sequence axis."""

    name: str
    make: Callable[[], keras.Model]
    inputs: Inputs  # (rng, samples, sequence length or None) → {input name: array}
    sequence: bool = False

    @property
    def source(self) -> str:
        return f"tests.zoo.models:{self.make.__name__}"


def _tokens(rng: np.random.Generator, n: int, length: int | None) -> dict[str, np.ndarray]:
    return {"tokens": rng.integers(1, VOCAB, (n, length or SEQ_LENGTHS[0])).astype(np.int32)}


def _frames(rng: np.random.Generator, n: int, length: int | None) -> dict[str, np.ndarray]:
    return {"frames": rng.normal(size=(n, length or SEQ_LENGTHS[0], 6)).astype(np.float32)}


def _two(rng: np.random.Generator, n: int, _: int | None) -> dict[str, np.ndarray]:
    return {"image": rng.random((n, 16, 16, 3), dtype=np.float32), "features": rng.normal(size=(n, 5)).astype(np.float32)}


ZOO = {
    z.name: z
    for z in (
        ZooModel("resnet50", resnet50, lambda rng, n, _: {"image": _normal_images(rng, n)}),
        ZooModel("mobilenet_v3_small", mobilenet_v3_small, lambda rng, n, _: {"image": _pixel_images(rng, n)}),
        ZooModel("densenet121", densenet121, lambda rng, n, _: {"image": _normal_images(rng, n)}),
        ZooModel("transformer", transformer_classifier, _tokens, sequence=True),
        ZooModel("lstm", lstm_classifier, _frames, sequence=True),
        ZooModel("preprocessing", preprocessing_cnn, lambda rng, n, _: {"pixels": _pixel_images(rng, n, (16, 16, 3))}),
        ZooModel("two_heads", two_heads, _two),
    )
}


def write_data(entry: ZooModel, folder: Path, *, calib: int = 128, evaluation: int = 512, seed: int = 0) -> dict[str, int]:
    """Write ``calib.npz`` and ``eval.npz`` (labels = the Keras model's own top-1) for ``entry``
    into ``folder``; sequence models get length buckets. Returns samples per length."""
    from pipeline.stages.savedmodel import input_names

    model = entry.make()
    names = input_names(model)
    rng = np.random.default_rng(seed)
    lengths: tuple[int | None, ...] = SEQ_LENGTHS if entry.sequence else (None,)
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, total in (("calib", calib), ("eval", evaluation)):
        arrays: dict[str, np.ndarray] = {}
        for index, length in enumerate(lengths):
            # Uneven buckets, so the most common length (the profile's OPT) is well defined.
            n = total - total * (len(lengths) - 1) * 2 // (5 * len(lengths)) if index == 0 else total * 2 // (5 * len(lengths))
            inputs = entry.inputs(rng, n, length)
            keyed = {name: inputs[name] for name in names}
            tag = f"__{length}" if length else ""
            arrays.update({f"{k}{tag}": v for k, v in keyed.items()})
            if split == "eval":
                outputs = model.predict(keyed if len(names) > 1 else keyed[names[0]], batch_size=64, verbose=0)
                probs = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
                arrays[f"labels{tag}"] = np.argmax(probs, axis=-1).astype(np.int64)
            counts[f"{split}{tag}"] = n
        np.savez(folder / f"{split}.npz", **arrays)
    return counts
