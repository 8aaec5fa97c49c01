"""The model zoo: everyday Keras model kinds at small input sizes, each with its own data.

Every entry is a ``module:function`` source for ``python -m pipeline build`` (``tests.zoo.models:resnet50``)
plus a generator of its calibration and evaluation arrays. The Keras Applications models have
random weights (seeded; their classifier refitted so classes spread over the data) and no ground
truth: their evaluation labels are the FP32 Keras model's own top-1, which makes accuracy
"agreement with Keras" and each gate a measure of what a precision loses. The small models are
trained for a few seconds on a synthetic task inside their ``module:function`` and labelled with
the task's truth.

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
    spread over the data: logits = the projections of its centred input features on their top
    principal directions, all in the first direction's units, times ``scale``. A random-weight
    backbone otherwise sends every input to one class, and a gate on a constant argmax measures
    nothing. (Not whitened: whitening would blow weak directions, and any noise in them, up to
    the strong one's size, which no trained classifier does.)"""
    head = next(layer for layer in reversed(model.layers) if getattr(layer, "kernel", None) is not None)
    features = keras.Model(model.inputs, head.input).predict(x, batch_size=64, verbose=0).reshape(len(x), -1)
    mean = features.mean(0)
    _, sv, vt = np.linalg.svd(features - mean, full_matrices=False)
    classes = head.kernel.shape[-1]
    weights = (vt[:classes].T / max(sv[0], 1e-6) * np.sqrt(len(x)) * scale).astype(np.float32)
    head.kernel.assign(weights.reshape(head.kernel.shape))
    head.bias.assign(-(mean @ weights).astype(np.float32))
    return model


def _image_app(app: Callable[..., keras.Model], seed: int, draw: Callable[[np.random.Generator, int], np.ndarray]) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = app(weights=None, input_tensor=keras.Input(IMAGE, name="image"), classes=CLASSES)
    return spread_head(model, draw(np.random.default_rng(seed), 256))


def _scenes(rng: np.random.Generator, n: int, shape: tuple[int, ...], colour: np.ndarray | None = None) -> np.ndarray:
    """Images in 0..1 that differ the way photos do, as a whole: a colour, a brightness gradient and a
    stripe pattern per image, plus a little pixel noise. Pure pixel noise would average out in the
    first pooling layer, leaving every image with the same features."""
    h, w, c = shape
    yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    colour = rng.random((n, 1, 1, c)) if colour is None else colour.reshape(n, 1, 1, c)
    slope_x, slope_y = rng.normal(0, 0.3, (2, n, 1, 1, c))
    freq, phase = rng.integers(1, 5, (n, 1, 1, 1)), rng.uniform(0, 2 * np.pi, (n, 1, 1, 1))
    angle = rng.uniform(0, np.pi, (n, 1, 1, 1))
    stripes = 0.25 * np.sin(2 * np.pi * freq * (np.cos(angle) * xx[..., None] + np.sin(angle) * yy[..., None]) + phase)
    image = colour + slope_x * xx[..., None] + slope_y * yy[..., None] + stripes + rng.normal(0, 0.03, (n, h, w, c))
    return np.clip(image, 0, 1).astype(np.float32)


def _normal_images(rng: np.random.Generator, n: int) -> np.ndarray:
    return (_scenes(rng, n, IMAGE) - 0.5) / 0.25  # roughly standardized, as caffe/torch preprocessing leaves them


def _pixel_images(rng: np.random.Generator, n: int, shape: tuple[int, ...] = IMAGE) -> np.ndarray:
    return _scenes(rng, n, shape) * 255


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


def _trained(model: keras.Model, draw: Callable[..., tuple[dict[str, np.ndarray], object]], lengths: tuple[int | None, ...] = (None,),
             epochs: int = 8, losses: object = "sparse_categorical_crossentropy") -> keras.Model:
    """Train ``model`` briefly on its task (the zoo's small models are trained, as real ones are:
    confident on most samples, so a gate measures the precision and not coin flips)."""
    rng = np.random.default_rng(1000)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=losses)
    for _ in range(2):
        for length in lengths:  # one fit per length: batches of one size, as served
            x, y = draw(rng, 768, length)
            model.fit(next(iter(x.values())) if len(x) == 1 else x, y, batch_size=64, epochs=max(1, epochs // (2 * len(lengths))), verbose=0, shuffle=True)
    return model


def transformer_classifier() -> keras.Model:
    """A Transformer encoder block over int32 token ids with a dynamic sequence axis → 4 classes,
    trained to tell which band of the vocabulary a sequence favours."""
    keras.utils.set_random_seed(13)
    ids = keras.Input((None,), dtype="int32", name="tokens")
    x = PositionEmbedding(VOCAB, 64, 32)(ids)
    attn = keras.layers.MultiHeadAttention(num_heads=2, key_dim=16)(x, x)
    x = keras.layers.LayerNormalization()(x + attn)
    ffn = keras.layers.Dense(64, activation="relu")(x)  # exact gelu lowers to Erfc, which tf2onnx 1.17 cannot convert
    x = keras.layers.LayerNormalization()(x + keras.layers.Dense(32)(ffn))
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(ids, keras.layers.Dense(4, activation="softmax", name="probs")(x))
    return _trained(model, lambda rng, n, length: _tokens(rng, n, length), SEQ_LENGTHS)


def lstm_classifier() -> keras.Model:
    """An LSTM over a dynamic time axis of 6 features → 3 classes, trained to find the raised channel."""
    keras.utils.set_random_seed(14)
    frames = keras.Input((None, 6), name="frames")
    x = keras.layers.LSTM(16)(frames)
    model = keras.Model(frames, keras.layers.Dense(3, activation="softmax", name="probs")(x))
    return _trained(model, lambda rng, n, length: _frames(rng, n, length), SEQ_LENGTHS)


def preprocessing_cnn() -> keras.Model:
    """Preprocessing inside the model: raw 0..255 pixels → Rescaling → Normalization (fixed
    per-channel mean/variance) → a small CNN → 5 colour classes."""
    keras.utils.set_random_seed(15)
    pixels = keras.Input((16, 16, 3), name="pixels")
    x = keras.layers.Rescaling(1.0 / 255)(pixels)
    x = keras.layers.Normalization(mean=[0.5, 0.45, 0.4], variance=[0.08, 0.07, 0.09])(x)
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(pixels, keras.layers.Dense(5, activation="softmax", name="probs")(x))
    return _trained(model, lambda rng, n, _: _colour_pixels(rng, n))


def two_heads() -> keras.Model:
    """Two inputs (an image and tabular features), two outputs: a 4-class softmax (the image's
    colour) and a regression value (a linear function of the features plus the brightness)."""
    keras.utils.set_random_seed(16)
    image = keras.Input((16, 16, 3), name="image")
    features = keras.Input((5,), name="features")
    x = keras.layers.Conv2D(8, 3, strides=2, activation="relu")(image)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Concatenate()([x, keras.layers.Dense(8, activation="relu")(features)])
    x = keras.layers.Dense(16, activation="relu")(x)
    cls = keras.layers.Dense(4, activation="softmax", name="cls")(x)
    value = keras.layers.Dense(1, name="value")(x)
    model = keras.Model([image, features], [cls, value])
    return _trained(model, lambda rng, n, _: _two(rng, n, None), losses=["sparse_categorical_crossentropy", "mse"], epochs=12)


# ----------------------------------------------------------------------------- data

Draw = Callable[[np.random.Generator, int, int | None], tuple[dict[str, np.ndarray], object]]


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry: its source, how its samples are drawn, and whether it has a sequence axis.

    ``draw(rng, samples, length)`` returns the inputs and the true labels (None for the random-weight
    applications, whose labels are the Keras model's own top-1)."""

    name: str
    make: Callable[[], keras.Model]
    draw: Draw
    sequence: bool = False

    @property
    def source(self) -> str:
        return f"tests.zoo.models:{self.make.__name__}"


COLOURS = np.array([[0.8, 0.2, 0.2], [0.2, 0.8, 0.2], [0.2, 0.2, 0.8], [0.8, 0.8, 0.2], [0.5, 0.5, 0.5]], np.float32)


def _colour_pixels(rng: np.random.Generator, n: int, classes: int = 5) -> tuple[dict[str, np.ndarray], np.ndarray]:
    label = rng.integers(0, classes, n)
    colour = COLOURS[label] + rng.normal(0, 0.08, (n, 3))
    return {"pixels": _scenes(rng, n, (16, 16, 3), colour) * 255}, label


def _tokens(rng: np.random.Generator, n: int, length: int | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Class c favours tokens from the c-th quarter of the vocabulary (60% of them), the rest uniform."""
    length = length or SEQ_LENGTHS[0]
    label = rng.integers(0, 4, n)
    band = 1 + label[:, None] * (VOCAB // 4) + rng.integers(0, VOCAB // 4 - 1, (n, length))
    tokens = np.where(rng.random((n, length)) < 0.6, band, rng.integers(1, VOCAB, (n, length)))
    return {"tokens": tokens.astype(np.int32)}, label


def _frames(rng: np.random.Generator, n: int, length: int | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Class c raises feature channel c by 0.8 at every step of otherwise unit noise."""
    label = rng.integers(0, 3, n)
    frames = rng.normal(size=(n, length or SEQ_LENGTHS[0], 6)).astype(np.float32)
    frames[np.arange(n), :, label] += 0.8
    return {"frames": frames}, label


def _two(rng: np.random.Generator, n: int, _: int | None) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    label = rng.integers(0, 4, n)
    image = _scenes(rng, n, (16, 16, 3), COLOURS[label] + rng.normal(0, 0.08, (n, 3)))
    features = rng.normal(size=(n, 5)).astype(np.float32)
    value = features @ np.array([0.5, -1.0, 0.3, 0.8, 0.0], np.float32) + 2 * image.mean(axis=(1, 2, 3))
    return {"image": image, "features": features}, [label, value.astype(np.float32)[:, None]]


ZOO = {
    z.name: z
    for z in (
        ZooModel("resnet50", resnet50, lambda rng, n, _: ({"image": _normal_images(rng, n)}, None)),
        ZooModel("mobilenet_v3_small", mobilenet_v3_small, lambda rng, n, _: ({"image": _pixel_images(rng, n)}, None)),
        ZooModel("densenet121", densenet121, lambda rng, n, _: ({"image": _normal_images(rng, n)}, None)),
        ZooModel("transformer", transformer_classifier, _tokens, sequence=True),
        ZooModel("lstm", lstm_classifier, _frames, sequence=True),
        ZooModel("preprocessing", preprocessing_cnn, lambda rng, n, _: _colour_pixels(rng, n)),
        ZooModel("two_heads", two_heads, _two),
    )
}


def write_data(entry: ZooModel, folder: Path, *, calib: int = 200, evaluation: int = 1024, seed: int = 0) -> dict[str, int]:
    """Write ``calib.npz`` and ``eval.npz`` for ``entry`` into ``folder``: labels are the task's own
    (the trained models) or the Keras model's top-1 (random-weight applications); sequence models
    get uneven length buckets, so the most common length (the profile's OPT) is well defined.
    Returns the samples per split and length."""
    rng = np.random.default_rng(seed)
    lengths: tuple[int | None, ...] = SEQ_LENGTHS if entry.sequence else (None,)
    folder.mkdir(parents=True, exist_ok=True)
    model = None
    counts = {}
    for split, total in (("calib", calib), ("eval", evaluation)):
        arrays: dict[str, np.ndarray] = {}
        for index, length in enumerate(lengths):
            n = total - total * (len(lengths) - 1) * 2 // (5 * len(lengths)) if index == 0 else total * 2 // (5 * len(lengths))
            inputs, truth = entry.draw(rng, n, length)
            tag = f"__{length}" if length else ""
            arrays.update({f"{k}{tag}": v for k, v in inputs.items()})
            if split == "eval":
                if truth is None:
                    model = model or entry.make()
                    outputs = model.predict(inputs if len(inputs) > 1 else next(iter(inputs.values())), batch_size=64, verbose=0)
                    truth = np.argmax(outputs[0] if isinstance(outputs, (list, tuple)) else outputs, axis=-1)
                classes = truth[0] if isinstance(truth, list) else truth
                arrays[f"labels{tag}"] = np.asarray(classes, dtype=np.int64)
            counts[f"{split}{tag}"] = n
        np.savez(folder / f"{split}.npz", **arrays)
    return counts
