"""Which kind each output is judged as (pipeline.accuracy.outputkinds): the rules, one reason per test (issue 29).

A wrong kind is a wrong gate: a multi-label head judged as one binary decision, class scores judged as
regression values, logits cut at a probability. Most tests feed the pure rules plain inputs; the Keras
description is read from tiny real Keras models, the ONNX producers from small hand-built graphs.
"""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

import numpy as np
import pytest

from pipeline.accuracy.compare import new_comparison
from pipeline.accuracy.outputkinds import (DESCRIPTION_FILE, OutputKind, _loss_name, _losses_by_output, check_override_names, compile_config_of_archive,
                                  compile_config_of_model, decide_kinds, describe_keras_outputs,
                                  describe_kinds, kinds_from_json, kinds_to_json, log_kinds, output_info, parse_output_kinds, primary_classes_output,
                                  onnx_producers, read_description, signature_from_description)
from pipeline.core.errors import PipelineError
from pipeline.data.tensors import ModelSignature, TensorSpec


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


# every loss name Keras gives (class or function, any case, with or without underscores) → the kind it trains
LOSSES = {
    "categorical_crossentropy": "classes", "SparseCategoricalCrossentropy": "classes", "CategoricalFocalCrossentropy": "classes",
    "categorical_hinge": "classes", "KLDivergence": "classes", "kld": "classes", "kullback_leibler_divergence": "classes",
    "binary_crossentropy": "binary", "BinaryFocalCrossentropy": "binary", "hinge": "binary", "squared_hinge": "binary",
    "mean_squared_error": "regression", "mse": "regression", "MeanAbsoluteError": "regression", "mae": "regression",
    "mean_absolute_percentage_error": "regression", "MAPE": "regression", "MeanSquaredLogarithmicError": "regression",
    "msle": "regression", "Huber": "regression", "log_cosh": "regression", "poisson": "regression",
    "CosineSimilarity": "embedding", "TripletLoss": "embedding", "contrastive_loss": "embedding",
    "HuberLoss": "regression", "PoissonLoss": "regression",  # a class name ending in Loss names the same loss
}


@pytest.mark.parametrize(("loss", "kind"), LOSSES.items(), ids=list(LOSSES))
def test_every_keras_loss_name_decides_what_its_output_is(loss: str, kind: str) -> None:
    """A linear head is judged by what it was trained for: a softmax-less classifier as classes, a regression head as values."""
    [decided] = decide(spec("y", ("batch", 1)), described=[keras_info("y", loss=loss)]).values()
    assert (decided.kind, decided.why) == (kind, f"trained with {loss}")
    assert decided.logits is (kind == "binary")  # a linear binary head gives logits: cut at logit(t)
    assert decided.classes == (1 if kind == "classes" else None)


def test_an_unknown_loss_leaves_the_decision_to_the_activation() -> None:
    """A custom loss says nothing: the softmax of the layer decides (classes), and a linear head without labels is regression."""
    kinds = decide(spec("probs", ("batch", 3)), spec("v", ("batch", 2)),
                   described=[keras_info("probs", activation="softmax", loss="my_loss"), keras_info("v", loss="custom_thing")])
    assert kinds["probs"] == OutputKind("probs", "classes", "softmax over 3 classes, layer 'probs' (Dense)", classes=3)
    assert kinds["v"] == OutputKind("v", "regression", "linear output, layer 'v' (Dense), no loss or labels saying otherwise")


def test_the_loss_shapes_the_kind_per_position_and_per_label() -> None:
    """A class loss on a map is segmentation; a binary loss on K > 1 columns is K labels; on [B] or [B, 1] one decision;
    on a map of one channel, one decision per position (multi-label)."""
    bce, cce = "binary_crossentropy", "sparse_categorical_crossentropy"
    kinds = decide(spec("mask", ("batch", 8, 8, 5)), spec("cls", ("batch", 5)), spec("tags", ("batch", 2)), spec("flag", ("batch",)),
                   spec("one", ("batch", 1)), spec("pixels", ("batch", 8, 8, 1)), spec("seq", ("batch", "time", 3)),
                   described=[keras_info("mask", loss=cce), keras_info("cls", loss=cce), keras_info("tags", loss=bce), keras_info("flag", loss=bce),
                              keras_info("one", loss=bce), keras_info("pixels", loss=bce), keras_info("seq", loss=cce)])
    assert {n: (k.kind, k.classes, k.logits) for n, k in kinds.items()} == {
        "mask": ("segmentation", 5, False), "cls": ("classes", 5, False), "tags": ("multilabel", 2, True), "flag": ("binary", None, True),
        "one": ("binary", None, True), "pixels": ("multilabel", 1, True), "seq": ("segmentation", 3, False)}


def test_a_loss_outranks_the_activation_and_an_override_outranks_the_loss() -> None:
    """Evidence order: --output-kind, then the loss, then the activation."""
    described = [keras_info("y", activation="softmax", loss="mse")]
    assert decide(spec("y", ("batch", 3)), described=described)["y"].kind == "regression"
    assert decide(spec("y", ("batch", 3)), described=described, overrides={"y": "embedding"})["y"] == OutputKind("y", "embedding", "--output-kind")


# ---- the activation, the ONNX producer, normalisation, labels, shape --------------------------------------------------


def test_a_softmax_is_classes_over_its_width_or_segmentation_over_a_map() -> None:
    """Softmax scores are probabilities (never logits); the class count is the last axis, '?' when unknown."""
    kinds = decide(spec("probs", ("batch", 10)), spec("mask", ("batch", 4, 4, 3)), spec("open", ("batch", -1)),
                   described=[keras_info("probs", activation="softmax"), keras_info("mask", activation="softmax", layer_class="Conv2D"),
                              keras_info("open", activation="softmax", layer_class="Softmax")])
    assert kinds == {
        "probs": OutputKind("probs", "classes", "softmax over 10 classes, layer 'probs' (Dense)", classes=10),
        "mask": OutputKind("mask", "segmentation", "softmax over 3 classes, layer 'mask' (Conv2D)", classes=3),
        "open": OutputKind("open", "classes", "softmax over ? classes, layer 'open' (Softmax)", classes=None),
    }


def test_a_sigmoid_is_one_decision_on_one_column_and_per_label_otherwise() -> None:
    """[B] and [B, 1] sigmoids are one binary decision; [B, K], [B, ?] and maps are decided per label; probabilities, not logits."""
    kinds = decide(spec("flag", ("batch",)), spec("one", ("batch", 1)), spec("tags", ("batch", 6)), spec("open", ("batch", "k")),
                   spec("map", ("batch", 4, 4, 1)),
                   described=[keras_info(n, activation="sigmoid") for n in ("flag", "one", "tags", "open", "map")])
    assert {n: (k.kind, k.classes, k.logits, k.why) for n, k in kinds.items()} == {
        "flag": ("binary", None, False, "sigmoid, layer 'flag' (Dense)"), "one": ("binary", None, False, "sigmoid, layer 'one' (Dense)"),
        "tags": ("multilabel", 6, False, "sigmoid, layer 'tags' (Dense)"), "open": ("multilabel", None, False, "sigmoid, layer 'open' (Dense)"),
        "map": ("multilabel", 1, False, "sigmoid, layer 'map' (Dense)")}


def test_without_keras_the_onnx_op_that_makes_the_output_decides() -> None:
    """A SavedModel has no Keras description: Softmax and Sigmoid ops are the activation, LpNormalization an embedding."""
    kinds = decide(spec("probs", ("batch", 4)), spec("p", ("batch", 1)), spec("emb", ("batch", 8)), spec("raw", ("batch", 2)),
                   producers={"probs": "Softmax", "p": "Sigmoid", "emb": "LpNormalization", "raw": "MatMul"})
    assert kinds == {
        "probs": OutputKind("probs", "classes", "softmax over 4 classes, ONNX Softmax", classes=4),
        "p": OutputKind("p", "binary", "sigmoid, ONNX Sigmoid"),
        "emb": OutputKind("emb", "embedding", "L2-normalised, ONNX LpNormalization"),
        "raw": OutputKind("raw", "regression", "linear output, ONNX MatMul, no loss or labels saying otherwise"),
    }


def test_the_keras_activation_outranks_the_onnx_op() -> None:
    """The Keras layer's own activation is the evidence; the ONNX op is read only when Keras says nothing."""
    kinds = decide(spec("a", ("batch", 3)), spec("b", ("batch", 3)), spec("c", ("batch", 3)),
                   described=[keras_info("a", activation="sigmoid"), keras_info("b", activation=None), {"name": "c", "activation": "softmax"}],
                   producers={"a": "Softmax", "b": "Softmax", "c": "Sigmoid"})
    assert kinds == {
        "a": OutputKind("a", "multilabel", "sigmoid, layer 'a' (Dense)", classes=3),
        "b": OutputKind("b", "classes", "softmax over 3 classes, layer 'b' (Dense)", classes=3),
        "c": OutputKind("c", "classes", "softmax over 3 classes, ONNX Sigmoid", classes=3),  # a description without the layer: the op is named
    }


def test_an_l2_normalised_layer_is_an_embedding() -> None:
    """UnitNormalization (or a layer named l2_normal…) makes an embedding, judged by angle, not as values."""
    kinds = decide(spec("emb", ("batch", 16)), spec("raw", ("batch", 16)),
                   described=[keras_info("emb", activation=None, layer_class="UnitNormalization", l2_normalized=True),
                              keras_info("raw", l2_normalized=False)])
    assert kinds["emb"] == OutputKind("emb", "embedding", "L2-normalised, layer 'emb' (UnitNormalization)")
    assert kinds["raw"].kind == "regression"


def test_labels_decide_a_linear_output_the_model_says_nothing_about() -> None:
    """Integer labels on K > 1 linear scores are class indices (a map: segmentation); float labels are regression targets;
    one linear column cannot be ranked, so integer labels leave it a value."""
    kinds = decide(spec("logits", ("batch", 2)), spec("mask", ("batch", 4, 4, 3)), spec("score", ("batch", 3)), spec("one", ("batch", 1)),
                   spec("bits", ("batch", 5)), spec("wide", ("batch", "k")),
                   targets={"logits": np.zeros(4, np.int64), "mask": np.zeros((4, 4, 4), np.uint8), "score": np.zeros((4, 3), np.float32),
                            "one": np.zeros(4, np.int64), "bits": np.zeros(4, np.bool_), "wide": np.zeros(4, np.int32)})
    assert kinds == {
        "logits": OutputKind("logits", "classes", "linear scores with integer labels (class indices)", classes=2),
        "mask": OutputKind("mask", "segmentation", "linear scores with integer labels (class indices)", classes=3),
        "score": OutputKind("score", "regression", "float labels (targets)"),
        "one": OutputKind("one", "regression", "linear output, no loss or labels saying otherwise"),
        "bits": OutputKind("bits", "classes", "linear scores with integer labels (class indices)", classes=5),
        "wide": OutputKind("wide", "regression", "linear output, no loss or labels saying otherwise"),
    }


def test_the_model_outranks_the_labels() -> None:
    """Float labels do not turn a softmax classifier into regression, nor a sigmoid into values."""
    kinds = decide(spec("probs", ("batch", 3)), spec("p", ("batch", 1)), described=[keras_info("probs", activation="softmax")],
                   producers={"p": "Sigmoid"}, targets={"probs": np.zeros((4, 3), np.float32), "p": np.zeros(4, np.float32)})
    assert (kinds["probs"].kind, kinds["p"].kind) == ("classes", "binary")


def test_an_empty_width_has_no_class_count() -> None:
    """A last axis of 0 (or unknown, -1) gives no K: the labels check cannot hold labels to [0, K)."""
    kinds = decide(spec("e", ("batch", 0)), spec("u", ("batch", -1)), producers={"e": "Softmax", "u": "Softmax"})
    assert (kinds["e"].classes, kinds["u"].classes) == (None, None)
    assert kinds["e"].why == "softmax over ? classes, ONNX Softmax"


# ---- --output-kind and dtypes --------------------------------------------------------------------------------------


def test_an_override_is_honoured_as_given_even_on_a_map() -> None:
    """--output-kind binary on a map stays binary (the user said so); the logits flag follows the activation and the dtype."""
    kinds = decide(spec("map", ("batch", 4, 4, 1)), spec("probs", ("batch", 3)), spec("ids", ("batch", 3), np.int64), spec("emb", ("batch", 3)),
                   described=[keras_info("map"), keras_info("probs", activation="softmax"), keras_info("ids"), keras_info("emb")],
                   overrides={"map": "binary", "probs": "multilabel", "ids": "segmentation", "emb": "classes"})
    assert kinds == {
        "map": OutputKind("map", "binary", "--output-kind", logits=True),
        "probs": OutputKind("probs", "multilabel", "--output-kind", logits=False, classes=3),  # softmax probabilities: cut at t, not logit(t)
        "ids": OutputKind("ids", "segmentation", "--output-kind", classes=3),
        "emb": OutputKind("emb", "classes", "--output-kind", classes=3),
    }


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.uint8, np.bool_], ids=lambda d: np.dtype(d).name)
def test_an_override_on_a_map_keeps_the_class_count_for_every_numeric_dtype(dtype: type) -> None:
    """Issue 29: --output-kind is honoured for every numeric dtype, with K from the last axis."""
    kinds = decide(spec("m", ("batch", 4, 4, 7), dtype), overrides={"m": "segmentation"})
    assert kinds["m"] == OutputKind("m", "segmentation", "--output-kind", classes=7)


def test_integer_outputs_are_values_whatever_the_keras_side_says() -> None:
    """Integers and booleans are scores or decisions as they are: no loss, activation or label makes them logits or classes."""
    kinds = decide(spec("ids", ("batch", 3), np.int64), spec("mask", ("batch",), np.bool_),
                   described=[keras_info("ids", activation="softmax", loss="categorical_crossentropy"), keras_info("mask", activation="sigmoid")],
                   targets={"ids": np.zeros(4, np.int64)})
    assert kinds == {"ids": OutputKind("ids", "regression", "int64 values, compared as numbers"),
                     "mask": OutputKind("mask", "regression", "bool values, compared as numbers")}


def test_an_output_no_kind_can_judge_is_refused_only_when_a_kind_is_asked_for() -> None:
    """--output-kind on a string output is one line naming the output and the fix; without it, the decision is not refused here."""
    with pytest.raises(PipelineError) as caught:
        decide(spec("text", ("batch",), np.str_), overrides={"text": "regression"})
    assert caught.value.problem == "--output-kind text=regression: output 'text' holds <U0 values, which no kind can judge"
    assert caught.value.fix == "drop --output-kind text=…; only numeric outputs (float, integer, bool) take a kind"
    assert decide(spec("text", ("batch",), np.str_))["text"] == OutputKind("text", "regression", "<U0 values, compared as numbers")


def test_an_override_naming_no_output_names_the_closest() -> None:
    """A typo in --output-kind is refused before anything is judged, naming the output meant."""
    with pytest.raises(PipelineError) as caught:
        decide(spec("box", ("batch", 4)), spec("probs", ("batch", 3)), overrides={"bx": "classes"})
    assert caught.value.problem == "--output-kind names 'bx', which is not an output of the model (outputs: box, probs)"
    assert caught.value.fix == "did you mean --output-kind box=classes?"
    with pytest.raises(PipelineError) as caught:
        check_override_names({"zzz": "classes"}, ["box", "probs"])
    assert caught.value.fix == "use one of the model's output names"
    check_override_names({"box": "classes", "probs": "classes"}, ["box", "probs"])  # every name an output: no error


@pytest.mark.parametrize(("values", "overrides"), [
    ([], {}), (["box=regression"], {"box": "regression"}), ([" box = Classes ", "probs=BINARY"], {"box": "classes", "probs": "binary"}),
    (["a=b=classes"], None), (["box=classes", "box=regression"], {"box": "regression"}),
])
def test_output_kind_options_are_parsed_name_equals_kind(values: list, overrides: dict | None) -> None:
    """NAME=KIND, spaces and case forgiven, the last one for a name wins; the kind is what follows the first '='."""
    if overrides is None:
        with pytest.raises(PipelineError, match="unknown output kind 'b=classes' in --output-kind a=b=classes"):
            parse_output_kinds(values)
    else:
        assert parse_output_kinds(values) == overrides


@pytest.mark.parametrize("text", ["box", "=classes", "box=", " = ", "box:classes"])
def test_a_malformed_output_kind_is_one_line(text: str) -> None:
    """Without a name, a kind or the '=' the option is refused with an example."""
    with pytest.raises(PipelineError) as caught:
        parse_output_kinds(["probs=classes", text])
    assert caught.value.problem == f"malformed --output-kind '{text}': expected NAME=KIND"
    assert caught.value.fix == "write e.g. --output-kind score=regression (kinds: classes, binary, multilabel, regression, segmentation, embedding)"


def test_an_unknown_kind_names_the_closest_or_lists_them_all() -> None:
    """A misspelt kind suggests the right option; one like no kind lists the kinds."""
    with pytest.raises(PipelineError) as caught:
        parse_output_kinds(["box=segmentaton"])
    assert (caught.value.problem, caught.value.fix) == ("unknown output kind 'segmentaton' in --output-kind box=segmentaton",
                                                        "use --output-kind box=segmentation")
    with pytest.raises(PipelineError) as caught:
        parse_output_kinds(["box=zzz"])
    assert caught.value.fix == "use one of: classes, binary, multilabel, regression, segmentation, embedding"


# ---- what is recorded and shown ------------------------------------------------------------------------------------


def test_kinds_survive_the_manifest_round_trip() -> None:
    """verify judges with the kinds the build recorded: the JSON form gives back the same kinds, in output order."""
    kinds = {"p": OutputKind("p", "binary", "sigmoid", logits=True), "m": OutputKind("m", "segmentation", "softmax", classes=3)}
    data = kinds_to_json(kinds)
    assert data == [{"name": "p", "kind": "binary", "why": "sigmoid", "logits": True, "classes": None},
                    {"name": "m", "kind": "segmentation", "why": "softmax", "logits": False, "classes": 3}]
    back = kinds_from_json(json.loads(json.dumps(data)))
    assert back == kinds and list(back) == ["p", "m"]


def test_a_record_from_an_older_build_reads_with_defaults() -> None:
    """A record without logits or classes (an older manifest) reads as probabilities with no fixed K; unknown keys are ignored."""
    assert OutputKind.from_dict({"name": "v", "kind": "regression", "why": "old", "extra": 1}) == OutputKind("v", "regression", "old")
    assert OutputKind.from_dict({"name": "p", "kind": "binary", "why": "w", "logits": True}).logits is True
    assert OutputKind.from_dict({"name": "c", "kind": "classes", "why": "w", "classes": 4}).classes == 4


def test_the_decision_is_one_line_naming_every_output(caplog: pytest.LogCaptureFixture) -> None:
    """The build says how each output will be judged, logits marked, and how to change it."""
    kinds = {"p": OutputKind("p", "binary", "trained with hinge", logits=True), "probs": OutputKind("probs", "classes", "softmax over 3 classes")}
    line = "'p': binary (logits) — trained with hinge; 'probs': classes — softmax over 3 classes"
    assert describe_kinds(kinds) == line
    with caplog.at_level(logging.INFO, logger="pipeline.accuracy.outputkinds"):
        log_kinds(kinds)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.INFO, f"outputs: {line} (override with --output-kind NAME=KIND)")]


def test_triton_labels_the_first_classes_output() -> None:
    """labels.txt belongs to the first classes output; a model without one has none."""
    kinds = {"p": OutputKind("p", "binary", "w"), "a": OutputKind("a", "classes", "w", classes=3), "b": OutputKind("b", "classes", "w", classes=5)}
    assert primary_classes_output(kinds) == "a"
    assert primary_classes_output({"p": OutputKind("p", "binary", "w")}) is None


def test_the_keras_description_promises_float_outputs_of_its_shapes() -> None:
    """Before ONNX exists the labels are checked against the Keras shapes: unknown axes are dynamic (-1), values float32."""
    signature = signature_from_description([{"name": "probs", "shape": [None, 3]}, {"name": "mask", "shape": [None, 4, None, 2]}])
    assert signature == ModelSignature((), (spec("probs", (-1, 3)), spec("mask", (-1, 4, -1, 2))))


def test_the_labels_check_sees_each_outputs_sample_shape_kind_and_classes() -> None:
    """check_targets holds the labels of each output to its per-sample shape, kind and K."""
    signature = ModelSignature((), (spec("probs", ("batch", 3)), spec("mask", ("batch", 4, 4, 2)), spec("v", ("batch",))))
    kinds = {"probs": OutputKind("probs", "classes", "w", classes=3), "mask": OutputKind("mask", "segmentation", "w", classes=2),
             "v": OutputKind("v", "regression", "w")}
    assert output_info(signature, kinds) == {"probs": ((3,), "classes", 3), "mask": ((4, 4, 2), "segmentation", 2), "v": ((), "regression", None)}


def test_an_output_without_a_recorded_kind_is_one_line_naming_it() -> None:
    """A served model with an output its build recorded no kind for is refused naming that output, not with a KeyError."""
    signature = ModelSignature((), (spec("probs", ("batch", 3)), spec("box", ("batch", 4)), spec("extra", ("batch", 2))))
    with pytest.raises(PipelineError) as caught:
        output_info(signature, {"probs": OutputKind("probs", "classes", "w", classes=3), "old": OutputKind("old", "regression", "w")})
    assert caught.value.problem == "no output kind recorded for 'box', 'extra' (known: probs, old)"
    assert "\n" not in str(caught.value) and caught.value.fix == "rebuild the model: its build records each output's kind"
    with pytest.raises(PipelineError) as none_recorded:  # a record with no kinds at all says so, not "(known: )"
        output_info(signature, {})
    assert none_recorded.value.problem == "no output kind recorded for 'probs', 'box', 'extra' (known: none)"


def test_the_description_stored_with_a_savedmodel_is_read_back(tmp_path: Path) -> None:
    """The ONNX stage reads the Keras description exported with the SavedModel; a SavedModel made elsewhere has none."""
    assert read_description(tmp_path) is None
    (tmp_path / DESCRIPTION_FILE).parent.mkdir()
    described = [{"name": "probs", "activation": "softmax", "shape": [None, 3], "loss": None}]
    (tmp_path / DESCRIPTION_FILE).write_text(json.dumps(described))
    assert read_description(tmp_path) == described and DESCRIPTION_FILE == Path("assets.extra/pipeline_outputs.json")


def test_a_keras_archive_keeps_its_compile_config(tmp_path: Path) -> None:
    """A .keras file loaded without compiling still says which loss trained each output; anything else has no config."""
    def archive(name: str, config: object, member: str = "config.json") -> Path:
        with zipfile.ZipFile(tmp_path / name, "w") as z:
            z.writestr(member, config if isinstance(config, str) else json.dumps(config))
        return tmp_path / name

    loss = {"probs": "categorical_crossentropy"}
    assert compile_config_of_archive(archive("m.keras", {"class_name": "Functional", "compile_config": {"loss": loss}})) == {"loss": loss}
    assert compile_config_of_archive(archive("plain.keras", {"class_name": "Functional"})) is None  # never compiled
    assert compile_config_of_archive(archive("empty.keras", {"compile_config": {}})) is None
    assert compile_config_of_archive(archive("other.keras", {"compile_config": {"loss": "mse"}}, member="model.json")) is None
    assert compile_config_of_archive(archive("broken.keras", "{not json")) is None
    (tmp_path / "weights.h5").write_bytes(b"\x89HDF\r\n")
    assert compile_config_of_archive(tmp_path / "weights.h5") is None and compile_config_of_archive(tmp_path / "missing.keras") is None


@pytest.mark.parametrize(("loss", "name"), [
    ("mse", "mse"),
    ({"module": "keras.losses", "class_name": "MeanSquaredError", "config": {"name": "mean_squared_error"}}, "MeanSquaredError"),
    ({"module": "builtins", "class_name": "function", "config": "mean_absolute_error"}, "mean_absolute_error"),
    ({"module": "builtins", "class_name": "function", "config": {"name": "x"}}, "function"),
    ({"module": "m", "config": {}}, ""), ({"class_name": None}, ""), (None, ""), (3, ""),
])
def test_a_serialized_loss_is_named_by_its_class_or_function(loss: object, name: str) -> None:
    """Keras stores a loss as a string, a class (class_name) or a function (class_name 'function', its name as config)."""
    assert _loss_name(loss) == name


def test_each_output_gets_the_loss_it_was_compiled_with() -> None:
    """One loss for all outputs, a dict by output name, or a list in output order; outputs without a loss are left out."""
    names = ["probs", "v"]
    huber = {"module": "keras.losses", "class_name": "Huber", "config": {"name": "huber_loss"}}
    function = {"module": "builtins", "class_name": "function", "config": "mean_absolute_error"}
    assert _losses_by_output(names, None) == {} and _losses_by_output(names, {"optimizer": "adam"}) == {}
    assert _losses_by_output(names, {"loss": "mse"}) == {"probs": "mse", "v": "mse"}
    assert _losses_by_output(names, {"loss": huber}) == {"probs": "Huber", "v": "Huber"}
    assert _losses_by_output(names, {"loss": {"class_name": None}}) == {}
    assert _losses_by_output(names, {"loss": {"probs": "categorical_crossentropy", "v": huber}}) == {"probs": "categorical_crossentropy", "v": "Huber"}
    assert _losses_by_output(names, {"loss": {"probs": None, "v": function}}) == {"v": "mean_absolute_error"}
    assert _losses_by_output(names, {"loss": ["categorical_crossentropy", function]}) == {"probs": "categorical_crossentropy", "v": "mean_absolute_error"}
    assert _losses_by_output(names, {"loss": (None, "mse")}) == {"v": "mse"}


# ---- the ONNX producer of each output (SavedModels, verify without a record) ----------------------------------------


def graph_producers(nodes: list[tuple[str, list[str], str]], outputs: list[str], constants: dict[str, float] | None = None) -> dict[str, str]:
    """onnx_producers of a graph of (op, inputs, output) nodes (the graph is only walked, never run); ``constants``:
    scalar initializers by name."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node(op, inputs, [out]) for op, inputs, out in nodes], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["b", 8]) for o in outputs],
                              [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (constants or {}).items()])
    return onnx_producers(helper.make_model(graph))


def test_the_producer_is_found_through_reshapes_casts_and_identities() -> None:
    """A softmax followed by Identity/Cast/Reshape/Squeeze/Unsqueeze/Flatten/Transpose still makes class scores;
    the data input (not the shape input) is followed."""
    chain = [("Softmax", ["x"], "s0")] + [(op, [f"s{i}", "shape"], f"s{i + 1}")
                                          for i, op in enumerate(["Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose"])]
    nodes = [("Constant", [], "shape"), *chain, ("Sigmoid", ["x"], "p"), ("Relu", ["x"], "r"), ("Identity", ["r"], "out")]
    assert graph_producers(nodes, ["s7", "p", "out", "x"]) == {"s7": "Softmax", "p": "Sigmoid", "out": "Relu"}  # a graph input has none


def test_a_pass_through_node_without_inputs_is_its_own_producer() -> None:
    """A malformed pass-through node (no input) does not crash the decision: it is named as the producer."""
    assert graph_producers([("Identity", [], "y")], ["y"]) == {"y": "Identity"}


@pytest.mark.parametrize("divide", ["Mul", "Div"])
@pytest.mark.parametrize("reduce", ["ReduceSumSquare", "ReduceL2"])
@pytest.mark.parametrize("between", ["Rsqrt", "Sqrt", "Reciprocal", "Max", "Min", "Add", "Clip"])
def test_x_divided_by_its_norm_is_an_l2_normalisation(divide: str, reduce: str, between: str) -> None:
    """What tf.math.l2_normalize and UnitNormalization become: x · f(‖x‖) through any of the ops they use."""
    nodes = [(reduce, ["x"], "n"), (between, ["eps", "n"], "f"), (divide, ["x", "f"], "y")]
    assert graph_producers(nodes, ["y"]) == {"y": "LpNormalization"}


@pytest.mark.parametrize(("square", "inputs", "normalises"), [
    ("Square", ["x"], True), ("Mul", ["x", "x"], True), ("Pow", ["x", "two"], True), ("Mul", ["x", "w"], False), ("Abs", ["x"], False),
    ("Pow", ["x", "three"], False), ("Pow", ["x", "w"], False), ("Pow", ["x"], False),
])
def test_a_reduce_sum_counts_as_a_norm_only_of_squares(square: str, inputs: list, normalises: bool) -> None:
    """ReduceSum(x²) is a squared norm; ReduceSum(x·w), ReduceSum(|x|) or ReduceSum(x³) is not (a p-norm for p ≠ 2
    is no L2 normalisation), so x divided by it is no embedding."""
    nodes = [(square, inputs, "sq"), ("ReduceSum", ["sq", "axes"], "ss"), ("Sqrt", ["ss"], "norm"), ("Div", ["x", "norm"], "y")]
    assert graph_producers(nodes, ["y"], {"two": 2.0, "three": 3.0, "w": 0.5}) == {"y": "LpNormalization" if normalises else "Div"}


@pytest.mark.parametrize(("value", "normalises"), [(2.0, True), (3.0, False)])
def test_a_squares_exponent_may_come_from_a_constant_node(value: float, normalises: bool) -> None:
    """tf2onnx and the Keras exporters write a Pow's exponent as a Constant node as often as an initializer."""
    from onnx import TensorProto, helper, numpy_helper

    exponent = helper.make_node("Constant", [], ["p"], value=numpy_helper.from_array(np.array(value, np.float32)))
    nodes = [helper.make_node(op, inputs, [out]) for op, inputs, out in
             [("Pow", ["x", "p"], "sq"), ("ReduceSum", ["sq"], "ss"), ("Sqrt", ["ss"], "norm"), ("Div", ["x", "norm"], "y")]]
    graph = helper.make_graph([exponent, *nodes], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])])
    assert onnx_producers(helper.make_model(graph)) == {"y": "LpNormalization" if normalises else "Div"}


def test_a_reduce_sum_of_nothing_is_no_norm() -> None:
    """A ReduceSum without inputs (malformed) or of a graph input is not a norm."""
    assert graph_producers([("ReduceSum", [], "ss"), ("Mul", ["x", "ss"], "y")], ["y"]) == {"y": "Mul"}
    assert graph_producers([("ReduceSum", ["x"], "ss"), ("Mul", ["x", "ss"], "y")], ["y"]) == {"y": "Mul"}


def test_the_norm_is_looked_for_four_ops_deep_and_no_deeper() -> None:
    """x · 1/sqrt(max(ΣX², ε) + 0): the norm four ops from the product is found; five ops away the product is not a normalisation."""
    four = [("ReduceSumSquare", ["x"], "n"), ("Max", ["n", "eps"], "a"), ("Sqrt", ["a"], "b"), ("Reciprocal", ["b"], "c"), ("Mul", ["x", "c"], "y")]
    assert graph_producers(four, ["y"]) == {"y": "LpNormalization"}
    five = [("ReduceSumSquare", ["x"], "n"), ("Add", ["n", "eps"], "m"), ("Max", ["m", "eps"], "a"), ("Sqrt", ["a"], "b"), ("Reciprocal", ["b"], "c"),
            ("Mul", ["x", "c"], "y")]
    assert graph_producers(five, ["y"]) == {"y": "Mul"}


def test_only_a_product_or_quotient_normalises() -> None:
    """x + ‖x‖ or x − ‖x‖ is not an L2 normalisation; neither is x · g(‖x‖) through an op that is not a norm's (Exp)."""
    assert graph_producers([("ReduceL2", ["x"], "n"), ("Add", ["x", "n"], "y"), ("Sub", ["x", "n"], "z")], ["y", "z"]) == {"y": "Add", "z": "Sub"}
    assert graph_producers([("ReduceL2", ["x"], "n"), ("Exp", ["n"], "e"), ("Mul", ["x", "e"], "y")], ["y"]) == {"y": "Mul"}


# ---- the Keras side (tiny real Keras models) ------------------------------------------------------------------------


def test_a_keras_model_is_described_per_output_with_its_compiled_loss() -> None:
    """Each output's layer, activation (a Softmax layer counts as softmax), normalisation, shape and loss, in Keras order:
    what the kinds of a .keras or module:function model are decided from."""
    import keras

    x = keras.Input((4,))
    h = keras.layers.Dense(3, name="hidden")(x)
    outputs = [keras.layers.Dense(3, activation="softmax", name="probs")(x), keras.layers.Dense(1, activation="sigmoid", name="p")(x),
               keras.layers.Dense(2, name="box")(x), keras.layers.Softmax(name="sm")(h), keras.layers.UnitNormalization(name="emb")(h),
               keras.layers.Dense(4, name="head_l2_normalize")(x), keras.layers.Reshape((1, 3), name="seq")(h)]
    model = keras.Model(x, outputs)
    assert compile_config_of_model(model) is None  # not compiled: no losses
    model.compile(loss={"probs": "categorical_crossentropy", "p": keras.losses.BinaryCrossentropy(), "box": keras.losses.mean_squared_error})
    described = describe_keras_outputs(model, ["probs", "p", "box", "sm", "emb", "head_l2_normalize", "seq"], compile_config_of_model(model))
    assert described == [
        {"name": "probs", "layer": "probs", "layer_class": "Dense", "activation": "softmax", "l2_normalized": False, "shape": [None, 3],
         "loss": "categorical_crossentropy"},
        {"name": "p", "layer": "p", "layer_class": "Dense", "activation": "sigmoid", "l2_normalized": False, "shape": [None, 1],
         "loss": "BinaryCrossentropy"},
        {"name": "box", "layer": "box", "layer_class": "Dense", "activation": "linear", "l2_normalized": False, "shape": [None, 2],
         "loss": "mean_squared_error"},
        {"name": "sm", "layer": "sm", "layer_class": "Softmax", "activation": "softmax", "l2_normalized": False, "shape": [None, 3], "loss": None},
        {"name": "emb", "layer": "emb", "layer_class": "UnitNormalization", "activation": None, "l2_normalized": True, "shape": [None, 3],
         "loss": None},
        {"name": "head_l2_normalize", "layer": "head_l2_normalize", "layer_class": "Dense", "activation": "linear", "l2_normalized": True,
         "shape": [None, 4], "loss": None},
        {"name": "seq", "layer": "seq", "layer_class": "Reshape", "activation": None, "l2_normalized": False, "shape": [None, 1, 3], "loss": None},
    ]
    signature = signature_from_description(described)
    kinds = decide_kinds(signature, described=described, producers={}, overrides={})
    assert {n: k.kind for n, k in kinds.items()} == {"probs": "classes", "p": "binary", "box": "regression", "sm": "classes", "emb": "embedding",
                                                    "head_l2_normalize": "embedding", "seq": "regression"}


def test_one_loss_for_every_output_and_a_list_in_output_order() -> None:
    """compile(loss=...) with one loss gives it to every output; a list gives each output its own, in Keras order."""
    import keras

    x = keras.Input((4,))
    model = keras.Model(x, [keras.layers.Dense(3, name="a")(x), keras.layers.Dense(1, name="b")(x)])
    model.compile(loss=keras.losses.Huber())
    assert [d["loss"] for d in describe_keras_outputs(model, ["a", "b"], compile_config_of_model(model))] == ["Huber", "Huber"]
    model.compile(loss=["sparse_categorical_crossentropy", keras.losses.binary_crossentropy])
    assert [d["loss"] for d in describe_keras_outputs(model, ["a", "b"], compile_config_of_model(model))] == ["sparse_categorical_crossentropy",
                                                                                                          "binary_crossentropy"]


def test_a_tf_keras_model_is_described_from_its_layers() -> None:
    """A Keras 2 (tf-keras) model keeps its layer under another attribute: its activations still decide the kinds."""
    import tf_keras

    x = tf_keras.Input((4,))
    model = tf_keras.Model(x, [tf_keras.layers.Dense(2, activation="sigmoid", name="tags")(x), tf_keras.layers.Dense(3, activation="softmax", name="c")(x)])
    described = describe_keras_outputs(model, ["tags", "c"], None)
    assert [(d["layer"], d["layer_class"], d["activation"], d["shape"], d["loss"]) for d in described] == [
        ("tags", "Dense", "sigmoid", [None, 2], None), ("c", "Dense", "softmax", [None, 3], None)]


def test_an_object_without_a_compile_config_has_none() -> None:
    """A model from a Keras without get_compile_config gives no losses (not a crash)."""
    assert compile_config_of_model(object()) is None  # type: ignore[arg-type]
