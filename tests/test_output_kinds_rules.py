"""Which kind each output is judged as (pipeline.outputkinds): the rules, one reason per test (issue 29).

A wrong kind is a wrong gate: a multi-label head judged as one binary decision, class scores judged as
regression values, logits cut at a probability. Most tests feed the pure rules plain inputs; the Keras
description is read from tiny real Keras models, the ONNX producers from small hand-built graphs.
"""

from __future__ import annotations

import numpy as np

from pipeline.compare import new_comparison
from pipeline.outputkinds import OutputKind, decide_kinds
from pipeline.tensors import ModelSignature, TensorSpec


def spec(name: str, shape: tuple, dtype: type = np.float32) -> TensorSpec:
    return TensorSpec(name, np.dtype(dtype), shape)


def keras_info(name: str, activation: str | None = "linear", loss: str | None = None, layer_class: str = "Dense", **more: object) -> dict:
    return {"name": name, "layer": name, "layer_class": layer_class, "activation": activation, "loss": loss, **more}


def decide(*specs: TensorSpec, described: list | None = None, producers: dict | None = None, overrides: dict | None = None,
           targets: dict | None = None) -> dict[str, OutputKind]:
    return decide_kinds(ModelSignature((), specs), described=described, producers=producers, overrides=overrides or {}, targets=targets)


# ---- the Keras loss ---------------------------------------------------------------------------------------------------


def test_a_binary_loss_on_an_output_of_unknown_width_is_judged_per_label_as_a_sigmoid_would_be() -> None:
    """An output of unknown width trained with binary cross-entropy is K labels (as with a known K > 1, and as its
    sigmoid would say): judged as one binary decision, a batch of 4 labels cannot even be compared."""
    rng = np.random.default_rng(0)
    unknown, known = spec("p", ("batch", "width")), spec("q", ("batch", 4))
    by_loss = decide(unknown, known, described=[keras_info("p", loss="binary_crossentropy"), keras_info("q", loss="binary_crossentropy")])
    by_sigmoid = decide(unknown, described=[keras_info("p", activation="sigmoid")])
    assert by_loss["p"] == OutputKind("p", "multilabel", "trained with binary_crossentropy", logits=True, classes=None)
    assert by_loss["q"].kind == "multilabel" and by_sigmoid["p"].kind == "multilabel"
    comparison = new_comparison("int8-onnx", {"p": by_loss["p"]}, 0.5)
    logits = rng.normal(size=(50, 4)).astype(np.float32)
    comparison.add({"p": logits}, {"p": logits}, {})  # raises when judged as one decision per sample
