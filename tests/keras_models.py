"""Small Keras models the tests convert: each exercises one thing conversion must get right.

They are built through `module:function` sources (``tests.keras_models:multi_io``), saved as
.keras files, or exported to SavedModels by the tests.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402


def multi_io() -> keras.Model:
    """Two float inputs, two outputs (a softmax head and a regression head)."""
    keras.utils.set_random_seed(1)
    image = keras.Input((6, 6, 2), name="image")
    meta = keras.Input((3,), name="meta")
    x = keras.layers.Conv2D(4, 3, activation="relu")(image)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Concatenate()([x, meta])
    x = keras.layers.Dense(8, activation="relu")(x)
    cls = keras.layers.Dense(3, activation="softmax", name="cls")(x)
    reg = keras.layers.Dense(1, name="reg")(x)
    return keras.Model([image, meta], [cls, reg])


def tokens() -> keras.Model:
    """Integer token ids with a dynamic sequence axis → embedding → pooled softmax."""
    keras.utils.set_random_seed(2)
    ids = keras.Input((None,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(100, 8)(ids)
    x = keras.layers.Conv1D(8, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    out = keras.layers.Dense(4, activation="softmax", name="probs")(x)
    return keras.Model(ids, out)


def sequential() -> keras.Model:
    """A Sequential model (no output_names attribute in Keras 3)."""
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((5,), name="features"), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2, activation="softmax")])


def exact_gelu() -> keras.Model:
    """Dense layers with exact GELU (``activation="gelu"``: TensorFlow lowers it to Erfc, which tf2onnx
    1.17 has no handler for; pipeline/stages/tf_ops.py converts it to 1 - Erf)."""
    keras.utils.set_random_seed(4)
    x = keras.Input((6,), name="features")
    h = keras.layers.Dense(16, activation="gelu")(x)
    h = keras.layers.Dense(16, activation="gelu")(h)
    return keras.Model(x, keras.layers.Dense(3, activation="softmax", name="probs")(h))


class _Igamma(keras.layers.Layer):
    def call(self, x):  # type: ignore[no-untyped-def]
        import tensorflow as tf

        return tf.math.igamma(x, x)


def unsupported_op() -> keras.Model:
    """Uses TensorFlow's Igamma, which tf2onnx cannot convert."""
    x = keras.Input((4,), name="x")
    return keras.Model(x, _Igamma(name="igamma")(x))


def not_a_model() -> str:
    return "I am a string"


def digits_rgb32(split: str):  # type: ignore[no-untyped-def]
    """The bundled digits split, upscaled to 32×32 RGB in -1..1 (what `--preprocess symmetric` makes of a PNG)."""
    import numpy as np

    from pipeline.models.digits import splits

    images, labels = splits()[split]
    big = np.kron(images[..., 0], np.ones((4, 4), np.float32))  # 8×8 → 32×32, nearest neighbour
    rgb = np.repeat(big[..., None], 3, axis=-1)
    return (rgb * 2.0 - 1.0).astype(np.float32), labels


def mobilenet_v2_digits() -> keras.Model:
    """Keras Applications MobileNetV2 (weights=None, alpha 0.35, 32×32×3) trained briefly on digits."""
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10, name="mobilenetv2")
    for layer in model.layers:  # the default 0.99 momentum needs far more steps than this small set gives
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.9
    model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="sparse_categorical_crossentropy")
    x, y = digits_rgb32("train")
    model.fit(x, y, batch_size=32, epochs=4, verbose=0)
    return model


def regression() -> keras.Model:
    """One real-valued output (linear Dense(1), trained with MSE): judged on its error relative to its spread."""
    keras.utils.set_random_seed(4)
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(32, activation="relu")(x)
    h = keras.layers.Dense(32, activation="relu")(h)
    model = keras.Model(x, keras.layers.Dense(1, name="value")(h))
    model.compile(loss="mse")
    return model


def two_heads() -> keras.Model:
    """A class head and a box head, in that order: tf2onnx sorts outputs by name, which puts ``box`` first."""
    keras.utils.set_random_seed(5)
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(32, activation="relu")(x)
    model = keras.Model(x, [keras.layers.Dense(4, activation="softmax", name="class_probs")(h), keras.layers.Dense(4, name="box")(h)])
    model.compile(loss=["sparse_categorical_crossentropy", "mse"])
    return model


def mixed_precision() -> keras.Model:
    """Built under the ``mixed_float16`` policy (float16 compute, float32 variables), softmax in float32."""
    keras.utils.set_random_seed(6)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x = keras.Input((8, 8, 3), name="image")
        h = keras.layers.Conv2D(8, 3, activation="relu")(x)
        h = keras.layers.GlobalAveragePooling2D()(h)
        logits = keras.layers.Dense(4)(h)
        return keras.Model(x, keras.layers.Activation("softmax", dtype="float32", name="probs")(logits))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def mixed_logits() -> keras.Model:
    """A ``mixed_float16`` CNN with 100 raw logits of magnitude up to ~30 (float16 compute; the output layer's result
    cast to float32): TensorFlow's own answer is only as close as float16's spacing there (0.0156 between 16 and 32).
    Random weights with nonzero biases (a dropped bias shows), a square 32×32 Dense (a transposed one shows), 3 input
    channels (swapped ones show); compiled with from-logits cross-entropy, so its output is a class output."""
    keras.utils.set_random_seed(17)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        bias = keras.initializers.RandomNormal(stddev=0.5)
        x = keras.Input((16, 16, 3), name="image")
        h = keras.layers.Conv2D(16, 3, activation="relu", bias_initializer=bias)(x)
        h = keras.layers.Conv2D(32, 3, strides=2, activation="relu", bias_initializer=bias)(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        h = keras.layers.Dense(32, activation="relu", bias_initializer=bias, name="square")(h)
        h = keras.layers.Dense(100, kernel_initializer=keras.initializers.RandomNormal(stddev=4.0), bias_initializer=bias)(h)
        model = keras.Model(x, keras.layers.Activation("linear", dtype="float32", name="logits")(h))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def mixed_bfloat16() -> keras.Model:
    """Built under ``mixed_bfloat16`` (bfloat16 compute; tf2onnx gives bfloat16 weights beside float16 casts), logits out."""
    keras.utils.set_random_seed(18)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        x = keras.Input((16, 16, 3), name="image")
        h = keras.layers.Conv2D(8, 3, activation="relu")(x)
        h = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(h))
        model = keras.Model(x, keras.layers.Activation("linear", dtype="float32", name="logits")(h))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _UniqueSum(keras.layers.Layer):
    def call(self, x):  # type: ignore[no-untyped-def]
        import tensorflow as tf

        return x + tf.reduce_sum(tf.unique(tf.reshape(x, [-1])).y)


def unparsable_op() -> keras.Model:
    """Uses tf.unique, converted to ONNX Unique: ONNX Runtime runs it, TensorRT's ONNX parser refuses it."""
    x = keras.Input((4,), name="x")
    return keras.Model(x, _UniqueSum(name="unique_sum")(x))
