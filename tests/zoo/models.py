"""The model zoo: everyday Keras model kinds at small input sizes, each with its own data.

Every entry is a ``module:function`` source for ``python -m pipeline build`` (``tests.zoo.models:resnet50``)
plus a generator of its calibration and evaluation arrays, labelled with the task's truth. The
Keras Applications backbones have random weights (seeded; BatchNorm statistics from the data,
ResNet50's residual branches damped as in a zero-init-residual start) and a class-mean classifier
on ten separable scene classes: training them is minutes per epoch on 2 cores. The small models are
trained for a few seconds on a synthetic task inside their ``module:function``.

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

from tests.zoo.scenes import CLASSES, IMAGE, prototype_scenes as _prototype_scenes, scenes as _scenes  # noqa: E402

SEQ_LENGTHS = (16, 20)
VOCAB = 200
RESIDUAL_GAMMA = 0.3
# MobileNetV3Small's inverted residuals are short (no 16-block chain): damped to 0.3 or 0.1 its
# features lose the classes (head norms of 1e4-1e6, where float rounding alone moves the output);
# 0.6 keeps 79% FP32 accuracy with a 500-norm head (measured on the zoo's data).
MOBILENET_GAMMA = 0.6


def batchnorm_from_data(model: keras.Model, x: np.ndarray) -> keras.Model:
    """Set every BatchNormalization's moving mean/variance to the statistics of ``x`` (one forward
    pass in training mode with momentum 0: each layer sees the previous ones already normalized).
    At initialization they are 0/1, which leaves a random backbone's activations collapsing or
    exploding with depth; after this they are as well scaled as in a trained network."""
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0
    model(x, training=True)
    for layer, momentum in zip(norms, momenta):
        layer.momentum = momentum
    return model


def damp_residual_branches(model: keras.Model, gamma: float = RESIDUAL_GAMMA) -> keras.Model:
    """Scale the last BatchNormalization of every residual branch (a BN feeding an ``Add``, not a
    projection shortcut's) by ``gamma``: the "zero-init residual" initialization (Goyal et al.
    2017; torchvision's ``zero_init_residual``), not quite zero. At full scale a random ResNet50 is
    chaotic: noise of 1e-4 of the input's std flips 1.2% of its FP32 top-1 and 1e-2 flips 25%, so
    no FP16 or INT8 model can agree with it; at 0.3 the same noise flips 0% and 1.2%, as in a
    trained network (measured on the zoo's data)."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.Add):
            for tensor in layer.input:
                source = tensor._keras_history.operation
                if isinstance(source, keras.layers.BatchNormalization) and not source.name.endswith("_0_bn"):
                    source.gamma.assign(source.gamma * gamma)
    return model


def _image_app(app: Callable[..., keras.Model], seed: int, draw: Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]],
               *, damp: float | None = None, shape: tuple[int, int, int] = IMAGE, bn_samples: int = 256) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = app(weights=None, input_tensor=keras.Input(shape, name="image"), classes=CLASSES)
    x, label = draw(np.random.default_rng(seed), 512)
    model = batchnorm_from_data(model, x[:bn_samples])
    return class_mean_head(model if damp is None else damp_residual_branches(model, damp), x, label)


def _normal_images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    images, label = _prototype_scenes(rng, n)
    return (images - 0.5) / 0.25, label  # roughly standardized, as caffe/torch preprocessing leaves them


def _pixel_images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    images, label = _prototype_scenes(rng, n)
    return images * 255, label


def class_mean_head(model: keras.Model, x: np.ndarray | dict[str, np.ndarray], label: np.ndarray, margin: float = 5.0, classes: int = CLASSES) -> keras.Model:
    """Set the classifier (the last layer with a kernel) to the nearest-class-mean rule on its input
    features, with the class means centred (m_c = μ_c − μ̄): logits_c = s·(f·m_c − μ̄·m_c − ‖m_c‖²/2),
    boundaries halfway between class means, ``s`` such that the median distance from a sample to
    its nearest other boundary is ``margin`` logits. Centred, the logits stay as small as a trained
    head's (tens); uncentred, a random backbone's large mean feature made them ~800 with a spread of
    20, where FP16's step is 0.5 and any FP16 model looked 0.1 off in probability."""
    head = next(layer for layer in reversed(model.layers) if getattr(layer, "kernel", None) is not None)
    features = keras.Model(model.inputs, head.input).predict(x, batch_size=64, verbose=0).reshape(len(label), -1).astype(np.float64)
    means = np.stack([features[label == c].mean(0) for c in range(classes)])
    centre = means.mean(0)
    means -= centre
    bias = -means @ centre - 0.5 * (means**2).sum(1)
    logits = features @ means.T + bias
    top2 = np.sort(logits, axis=1)[:, -2:]
    scale = margin / max(float(np.median(top2[:, 1] - top2[:, 0])), 1e-12)
    head.kernel.assign((means.T * scale).astype(np.float32).reshape(head.kernel.shape))
    head.bias.assign(((bias - bias.mean()) * scale).astype(np.float32))
    return model


def resnet50() -> keras.Model:
    """Keras Applications ResNet50, random weights (classifier spread over the data), 32×32×3, 10 classes."""
    return _image_app(keras.applications.ResNet50, 10, _normal_images, damp=RESIDUAL_GAMMA)


def mobilenet_v3_small() -> keras.Model:
    """Keras Applications MobileNetV3Small (Rescaling inside, hard-swish, SE blocks), random weights, 32×32×3 pixels 0..255."""
    return _image_app(keras.applications.MobileNetV3Small, 11, _pixel_images, damp=MOBILENET_GAMMA)


def densenet121() -> keras.Model:
    """Keras Applications DenseNet121 (deep Concat chains), random weights, 32×32×3."""
    return _image_app(keras.applications.DenseNet121, 12, _normal_images)


MOBILENET_V2_IMAGE = (224, 224, 3)


def _unit_scenes_224(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    images, label = _prototype_scenes(rng, n, MOBILENET_V2_IMAGE)
    return images * 2 - 1, label  # MobileNetV2's preprocessing: -1..1


def mobilenet_v2_224() -> keras.Model:
    """Keras Applications MobileNetV2 at its ImageNet size, 224×224×3 in -1..1, random weights: the
    CPU INT8 benchmark's model (scripts/bench_int8_cpu.py), not in the zoo run. BatchNorm statistics
    from 32 images (256 at 224×224 hold ~8 GB of training-mode activations)."""
    return _image_app(keras.applications.MobileNetV2, 13, _unit_scenes_224, shape=MOBILENET_V2_IMAGE, bn_samples=32)


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

    ``draw(rng, samples, length)`` returns the inputs and the true labels. ``eval_samples`` is the
    size of its labeled evaluation set; ``build_args`` are the tolerances its owner would set (each
    with the reason where it is defined)."""

    name: str
    make: Callable[[], keras.Model]
    draw: Draw
    sequence: bool = False
    eval_samples: int = 1024
    build_args: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        return f"{self.make.__module__}:{self.make.__name__}"


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


def _image_and_label(drawn: tuple[np.ndarray, np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    return {"image": drawn[0]}, drawn[1]


# MobileNetV3Small and DenseNet121: FP16 agrees with FP32 on the top-1 of every evaluation sample, but the
# softmax of a near-tie sample moves by 0.02-0.03 (DenseNet121, MobileNetV3Small; 121 and 50 layers
# of FP16 rounding), over the default max-abs limit of 0.01 meant for small heads; their owner sets 0.05.
# 4096 samples: INT8 disagrees with FP32 on ~4% of MobileNetV3Small's samples, and at 1024 the
# drop's 95% bounds (±0.95 points) cannot judge the 1-point limit.
BACKBONE_EVAL, BACKBONE_ARGS = 4096, ("--fp16-atol", "0.05")
# MobileNetV3Small's INT8 loses 0.61 points [0.15, 1.09]: undecided against the 1-point limit even on
# 4096 samples (MobileNetV3 is known to be hard to quantize after training). Its owner does what the
# failed gate's message says (run with a tight --int8-max-drop to get it): keep the three layers that
# add the most error in float. Then 0.51 points [0.09, 0.94]: a real drop, within the limit.
MOBILENET_KEEP = ",".join(f"StatefulPartitionedCall/MobileNetV3Small_1/{node}" for node in (
    "logits_1/BiasAdd", "expanded_conv_depthwise_1/depthwise", "expanded_conv_1_depthwise_1/depthwise"))

ZOO = {
    z.name: z
    for z in (
        ZooModel("resnet50", resnet50, lambda rng, n, _: _image_and_label(_normal_images(rng, n))),  # the defaults hold
        ZooModel("mobilenet_v3_small", mobilenet_v3_small, lambda rng, n, _: _image_and_label(_pixel_images(rng, n)), eval_samples=BACKBONE_EVAL, build_args=(*BACKBONE_ARGS, "--int8-keep-nodes", MOBILENET_KEEP)),
        ZooModel("densenet121", densenet121, lambda rng, n, _: _image_and_label(_normal_images(rng, n)), eval_samples=BACKBONE_EVAL, build_args=BACKBONE_ARGS),
        ZooModel("transformer", transformer_classifier, _tokens, sequence=True),
        ZooModel("lstm", lstm_classifier, _frames, sequence=True),
        ZooModel("preprocessing", preprocessing_cnn, lambda rng, n, _: _colour_pixels(rng, n)),
        ZooModel("two_heads", two_heads, _two),
    )
}


def write_data(entry: ZooModel, folder: Path, *, calib: int = 200, seed: int = 0) -> dict[str, int]:
    """Write ``calib.npz`` and ``eval.npz`` (``entry.eval_samples``, with the task's true labels) for ``entry`` into
    ``folder``; sequence models get uneven length buckets, so the most common length (the
    profile's OPT) is well defined. Returns the samples per split and length."""
    rng = np.random.default_rng(seed)
    lengths: tuple[int | None, ...] = SEQ_LENGTHS if entry.sequence else (None,)
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, total in (("calib", calib), ("eval", entry.eval_samples)):
        arrays: dict[str, np.ndarray] = {}
        for index, length in enumerate(lengths):
            n = total - total * (len(lengths) - 1) * 2 // (5 * len(lengths)) if index == 0 else total * 2 // (5 * len(lengths))
            inputs, truth = entry.draw(rng, n, length)
            tag = f"__{length}" if length else ""
            arrays.update({f"{k}{tag}": v for k, v in inputs.items()})
            if split == "eval":
                classes = truth[0] if isinstance(truth, list) else truth
                arrays[f"labels{tag}"] = np.asarray(classes, dtype=np.int64)
            counts[f"{split}{tag}"] = n
        np.savez(folder / f"{split}.npz", **arrays)
    return counts
