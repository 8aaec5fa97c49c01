"""Which model inputs take raw 0..255 pixels (a Rescaling of 1/255 or 1/127.5, one or per channel, or a
Normalization right after the input): what --raw-inputs image reads to leave the scaling to the model."""

from __future__ import annotations

import pytest

keras = pytest.importorskip("keras")

from pipeline.stages.savedmodel import input_scaling_layers  # noqa: E402


def _model(layer):  # type: ignore[no-untyped-def]
    inputs = keras.Input((8, 8, 3), name="img")
    return keras.Model(inputs, keras.layers.Conv2D(2, 3)(layer(inputs)))


@pytest.mark.parametrize(("layer", "expected"), [
    (lambda: keras.layers.Rescaling(1 / 255.0, name="r"), "Rescaling layer 'r' (x · 0.00392157 + 0)"),
    (lambda: keras.layers.Rescaling([1 / 255.0] * 3, [0.0] * 3, name="r"), "Rescaling layer 'r' (x · 0.00392157 0.00392157 0.00392157 + 0 0 0)"),
    (lambda: keras.layers.Rescaling(1 / 127.5, -1.0, name="r"), "Rescaling layer 'r' (x · 0.00784314 + -1)"),
    (lambda: keras.layers.Normalization(mean=[120.0] * 3, variance=[3000.0] * 3, name="n"), "Normalization layer 'n'"),
    (lambda: keras.layers.Rescaling(2.0, -1.0, name="r"), None),  # expects 0..1 input: --preprocess decides
    (lambda: keras.layers.Conv2D(3, 1, name="c"), None),
])
def test_scaling_layers_found(layer, expected) -> None:  # type: ignore[no-untyped-def]
    found = input_scaling_layers(_model(layer()))
    assert found.get("img") == expected
