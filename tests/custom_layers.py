"""A custom Keras layer registered for serialization: a `.keras` using it loads only after this module is imported."""

from __future__ import annotations

import keras


@keras.saving.register_keras_serializable(package="pipeline_tests")
class ScaledSwish(keras.layers.Layer):
    def __init__(self, scale: float = 1.5, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.scale = scale

    def call(self, x):  # type: ignore[no-untyped-def]
        return x * keras.ops.sigmoid(self.scale * x)

    def get_config(self) -> dict:
        return {**super().get_config(), "scale": self.scale}


def model() -> keras.Model:
    keras.utils.set_random_seed(7)
    x = keras.Input((6,), name="x")
    return keras.Model(x, keras.layers.Dense(3, activation="softmax", name="p")(ScaledSwish()(keras.layers.Dense(16)(x))))
