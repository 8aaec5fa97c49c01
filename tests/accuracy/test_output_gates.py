"""Every kind of output is judged by what it means (pipeline.accuracy.outputkinds, pipeline.accuracy.taskstats, pipeline.accuracy.judging).

Each test feeds a reference and a candidate output through the same Comparison the build and
``verify`` use, and checks that the gate fails for a real reason (a scale error, a flipped
decision, a NaN, a segmentation map that changes class) and passes once the output is right.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.accuracy.compare import new_comparison
from pipeline.accuracy.evaldata import UNNAMED, check_targets
from pipeline.accuracy.gates import Gates, tolerance_for
from pipeline.accuracy.judging import VariantResult, judge_comparison
from pipeline.accuracy.outputkinds import OutputKind, decide_kinds, parse_output_kinds
from pipeline.core.errors import PipelineError
from pipeline.data.tensors import ModelSignature, TensorSpec
from tests.judged import judge as judged

INT8 = tolerance_for("int8", Gates())


def judge(kind: OutputKind, ref: np.ndarray, out: np.ndarray, target: np.ndarray | None = None, batch: int = 100) -> VariantResult:
    return judged(kind, ref, out, target, batch, INT8)


def verdicts(result: VariantResult) -> dict[str, str]:
    return {row["metric"]: row["verdict"] for row in result.rows}


REG = OutputKind("value", "regression", "test")


def test_regression_on_the_wrong_scale_fails_and_a_small_error_passes() -> None:
    RNG = np.random.default_rng(0)
    ref = (RNG.normal(size=(1000, 1)) + 3.3).astype(np.float32)
    targets = ref + RNG.normal(scale=0.3, size=ref.shape).astype(np.float32)
    wrong = judge(REG, ref, ref * 0.58, targets)  # 42% off, as an INT8 calibrated on data ÷100 was
    assert not wrong.passed and "output 'value' (regression): R² drop" in wrong.failures[0]
    assert judge(REG, ref, ref * 0.58).failures[0].startswith("output 'value' (regression): RMS change / FP32 std")
    good = judge(REG, ref, ref + RNG.normal(scale=0.01, size=ref.shape).astype(np.float32), targets)
    assert good.passed and verdicts(good) == {"R² drop": "pass", "RMS change / FP32 std": "reported"}


def test_harmless_sign_changes_near_zero_pass() -> None:
    RNG = np.random.default_rng(0)
    # a head whose values sit near zero: INT8 noise flips their signs (cosine of [B,1] outputs is ±1) but is 1% of their spread
    ref = RNG.normal(scale=0.05, size=(1000, 1)).astype(np.float32)
    out = ref + RNG.normal(scale=0.0005, size=ref.shape).astype(np.float32)
    assert (np.sign(out) != np.sign(ref)).sum() > 0
    assert judge(REG, ref, out).passed


BINARY = OutputKind("spam", "binary", "test")


def test_a_flipped_sigmoid_fails_and_a_close_one_passes() -> None:
    RNG = np.random.default_rng(0)
    p = RNG.random((1000, 1)).astype(np.float32)
    flipped = judge(BINARY, p, 1 - p)
    assert not flipped.passed and "output 'spam' (binary): decision disagreement 100.00 points" in flipped.failures[0]
    assert judge(BINARY, p, np.clip(p + 1e-4, 0, 1)).passed


def test_binary_logits_are_cut_at_zero() -> None:
    RNG = np.random.default_rng(0)
    logits = RNG.normal(size=(1000, 1)).astype(np.float32)
    kind = OutputKind("spam", "binary", "test", logits=True)
    assert judge(kind, logits, logits + 1e-4).passed  # a 0.5 cut on logits would call nearly half of them positive wrongly
    assert not judge(kind, logits, -logits).passed


def test_nan_fails_every_kind_unless_fp32_has_it_too() -> None:
    RNG = np.random.default_rng(0)
    ref = RNG.random((1000, 10)).astype(np.float32)
    out = ref.copy()
    out[7, 3] = np.nan
    result = judge(OutputKind("probs", "classes", "test", classes=10), ref, out)
    assert not result.passed and result.failures[0] == "output 'probs' (classes): 1 NaN/Inf values in 1 samples where FP32 has finite ones"
    ref_nan = ref.copy()
    ref_nan[7, 3] = np.nan
    assert judge(OutputKind("probs", "classes", "test", classes=10), ref_nan, out).passed
    inf = ref.copy()
    inf[0, 0] = np.inf
    assert not judge(REG, ref, inf).passed


def test_segmentation_judges_positions_not_the_flattened_map() -> None:
    RNG = np.random.default_rng(0)
    kind = OutputKind("mask", "segmentation", "test", classes=4)
    scores = RNG.random((200, 8, 8, 4)).astype(np.float32)
    changed = scores.copy()
    changed[:, :, :2, :] = changed[:, :, :2, ::-1]  # a quarter of the positions change class; the flattened cosine stays high
    flat = (scores.reshape(200, -1) * changed.reshape(200, -1)).sum(1) / (np.linalg.norm(scores.reshape(200, -1), axis=1) ** 2)
    assert flat.mean() > 0.9
    result = judge(kind, scores, changed)
    assert not result.passed and "positions changing class" in result.failures[0]
    labels = scores.argmax(-1)
    labeled = judge(kind, scores, changed, labels)
    assert not labeled.passed and "mIoU drop" in labeled.failures[0]
    assert judge(kind, scores, scores + 1e-6, labels).passed


def test_multilabel_decisions_per_label() -> None:
    RNG = np.random.default_rng(0)
    kind = OutputKind("tags", "multilabel", "test", classes=5)
    p = RNG.random((600, 5)).astype(np.float32)
    worse = p.copy()
    worse[:, 0] = 1 - worse[:, 0]  # one of five labels flipped: 20% of decisions
    assert "label decisions flipped 20" in judge(kind, p, worse).failures[0]
    truth = (p > 0.5).astype(np.int64)
    assert "label accuracy drop 20" in judge(kind, p, worse, truth).failures[0]
    assert judge(kind, p, p, truth).passed


def test_embeddings_are_judged_by_angle_and_neighbours() -> None:
    RNG = np.random.default_rng(0)
    kind = OutputKind("emb", "embedding", "test")
    centres = RNG.normal(size=(50, 32))
    vectors = (np.repeat(centres, 10, axis=0) + RNG.normal(scale=0.3, size=(500, 32))).astype(np.float32)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert judge(kind, unit, unit + RNG.normal(scale=1e-4, size=unit.shape).astype(np.float32)).passed
    shuffled = judge(kind, unit, unit[RNG.permutation(500)])
    assert not shuffled.passed and set(verdicts(shuffled).values()) == {"fail"}
    assert {"mean cosine to FP32", "5th-percentile cosine", "nearest-neighbour agreement"} <= set(verdicts(shuffled))


def test_too_few_samples_is_undecided_not_passed() -> None:
    RNG = np.random.default_rng(0)
    p = RNG.random((40, 10)).astype(np.float32)
    result = judge(OutputKind("probs", "classes", "test", classes=10), p, p)
    assert not result.passed and result.undecided and "not enough evaluation data to judge a 1-point limit" in result.undecided[0]
    assert result.undecided[0].endswith("; even a perfect result needs ≥ 268 samples")  # bounds.min_samples(1.0, 0.95)


def test_an_output_without_a_kind_fails_and_is_named() -> None:
    """An output nothing judges must not pass: a variant whose second output is garbage would be published."""
    RNG = np.random.default_rng(0)
    probs = RNG.random((400, 10)).astype(np.float32)
    kind = OutputKind("probs", "classes", "test", classes=10)
    comparison = new_comparison("int8-onnx", {"probs": kind}, INT8.threshold)
    comparison.add({"probs": probs, "box": probs[:, :4]}, {"probs": probs, "box": -probs[:, :4]}, {})
    result = judge_comparison("int8-onnx", "int8", "onnx", comparison, INT8, {"probs": kind})
    assert not result.passed and result.failures == ["output 'box' has no kind, so no gate judges it (known: probs)"]
    assert {r["output"]: r["verdict"] for r in result.rows if r["metric"] == "output kind"} == {"box": "fail"}


# ---- kinds and labels ----------------------------------------------------------------------------------------------


def signature(*outputs: tuple[str, tuple]) -> ModelSignature:
    return ModelSignature((), tuple(TensorSpec(n, np.dtype(np.float32), s) for n, s in outputs))


def test_kinds_come_from_loss_activation_normalisation_labels_and_overrides() -> None:
    RNG = np.random.default_rng(0)
    sig = signature(("box", ("batch", 4)), ("class_probs", ("batch", 3)), ("emb", ("batch", 8)), ("mask", ("batch", 4, 4, 3)),
                    ("p", ("batch", 1)), ("logits", ("batch", 10)))
    described = [
        {"name": "box", "layer": "box", "layer_class": "Dense", "activation": "linear", "loss": None},
        {"name": "class_probs", "layer": "class_probs", "layer_class": "Dense", "activation": "softmax", "loss": None},
        {"name": "emb", "layer": "emb", "layer_class": "UnitNormalization", "activation": None, "l2_normalized": True, "loss": None},
        {"name": "mask", "layer": "mask", "layer_class": "Conv2D", "activation": "linear", "loss": "SparseCategoricalCrossentropy"},
        {"name": "p", "layer": "p", "layer_class": "Dense", "activation": "linear", "loss": "binary_crossentropy"},
        {"name": "logits", "layer": "logits", "layer_class": "Dense", "activation": "linear", "loss": None},
    ]
    kinds = decide_kinds(sig, described=described, producers={}, overrides={}, targets={"logits": np.zeros(3, np.int64)})
    assert {n: k.kind for n, k in kinds.items()} == {"box": "regression", "class_probs": "classes", "emb": "embedding", "mask": "segmentation",
                                                      "p": "binary", "logits": "classes"}
    assert kinds["p"].logits and not kinds["class_probs"].logits and kinds["mask"].classes == 3
    assert decide_kinds(sig, described=described, producers={}, overrides={"box": "embedding"})["box"].why == "--output-kind"
    # without Keras (a SavedModel): the ONNX op that makes the output
    assert decide_kinds(signature(("y", ("batch", 1))), described=None, producers={"y": "Sigmoid"}, overrides={})["y"].kind == "binary"


def test_a_bad_override_is_one_line_naming_the_closest() -> None:
    RNG = np.random.default_rng(0)
    with pytest.raises(PipelineError, match="unknown output kind 'regresion'") as info:
        parse_output_kinds(["box=regresion"])
    assert info.value.fix == "use --output-kind box=regression"
    with pytest.raises(PipelineError, match="did you mean --output-kind box=classes"):
        decide_kinds(signature(("box", ("batch", 4))), described=None, producers={}, overrides={"bx": "classes"})


OUTPUTS = {"class_probs": ((3,), "classes", 3), "box": ((4,), "regression", None), "mask": ((4, 4, 3), "segmentation", 3)}


@pytest.mark.parametrize(("targets", "message"), [
    ({UNNAMED: np.full(5, 12)}, "labels of output 'class_probs' (classes) in d.npz run from 12 to 12, but the output has 3 classes (0 to 2)"),
    ({"class_probs": np.arange(1, 4)}, "they look 1-based"),
    ({"clas_probs": np.zeros(5, np.int64)}, "rename the array to labels:class_probs"),
    ({"box": np.zeros((5, 3), np.float32)}, "are (3,) per sample; expected the output's shape (4,)"),
    ({"class_probs": np.zeros((5, 3), np.float32)}, "expected integer class indices"),
    ({"mask": np.zeros((5, 4, 4), np.int64) + 3}, "run from 3 to 3, but the output has 3 classes"),
])
def test_labels_the_output_cannot_produce_are_one_error(targets: dict, message: str) -> None:
    RNG = np.random.default_rng(0)
    with pytest.raises(PipelineError) as info:
        check_targets(targets, OUTPUTS, "d.npz")
    assert message in str(info.value)


def test_good_labels_pass_the_check() -> None:
    RNG = np.random.default_rng(0)
    check_targets({UNNAMED: np.array([0, 2, 1]), "box": np.zeros((3, 4), np.float32), "mask": np.zeros((3, 4, 4), np.int64)}, OUTPUTS, "d.npz")


def test_an_l2_normalised_onnx_output_is_an_embedding() -> None:
    RNG = np.random.default_rng(0)
    from onnx import TensorProto, helper

    from pipeline.accuracy.outputkinds import onnx_producers

    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("ReduceSum", ["sq", "axes"], ["ss"], keepdims=1),
             helper.make_node("Sqrt", ["ss"], ["norm"]), helper.make_node("Reciprocal", ["norm"], ["inv"]),
             helper.make_node("Mul", ["x", "inv"], ["emb"]), helper.make_node("Softmax", ["x"], ["probs"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
                              [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["b", 8]), helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["b", 8])],
                              [helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    producers = onnx_producers(helper.make_model(graph))
    assert producers == {"emb": "LpNormalization", "probs": "Softmax"}
    kinds = decide_kinds(signature(("emb", ("b", 8)), ("probs", ("b", 8))), described=None, producers=producers, overrides={})
    assert (kinds["emb"].kind, kinds["probs"].kind) == ("embedding", "classes")


def test_a_float16_graph_computes_in_float32_and_keeps_integer_casts() -> None:
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.stages.mixed import float32_from_mixed, was_mixed

    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16), helper.make_node("Cast", ["ids"], ["ids16"], to=TensorProto.FLOAT16),
             helper.make_node("Add", ["x16", "ids16"], ["s16"]), helper.make_node("Mul", ["s16", "w"], ["y16"]),
             helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2]),
                                           helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])],
                              [numpy_helper.from_array(np.array([0.5, 2.0], np.float16), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert float32_from_mixed(model) and was_mixed(model)
    ops = [(n.op_type, [a.i for a in n.attribute]) for n in model.graph.node]
    assert ops == [("Identity", []), ("Cast", [TensorProto.FLOAT]), ("Add", []), ("Mul", []), ("Identity", [])]
    assert model.graph.initializer[0].data_type == TensorProto.FLOAT

    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    [y] = session.run(None, {"x": np.array([[1.0, 2.0]], np.float32), "ids": np.array([[3, 4]], np.int64)})
    assert y.dtype == np.float32 and y.tolist() == [[2.0, 12.0]]
