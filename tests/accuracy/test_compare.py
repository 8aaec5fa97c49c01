"""Comparing models batch by batch (pipeline/accuracy/compare.py) through Polygraphy ONNX runners (pipeline/backend/runners.py).

Tiny real ONNX models (onnx.helper) run in ONNX Runtime; the expected statistics are computed with numpy.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.accuracy.compare import OutputStats, compare_runners
from pipeline.accuracy.outputkinds import OutputKind
from pipeline.backend.runners import runner_for_onnx
from pipeline.core.errors import PipelineError

PROBS = {"probs": OutputKind("probs", "classes", "test", classes=3)}

WEIGHTS = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5.0) / 4.0


def linear_softmax(path: Path, weights: np.ndarray, output: str = "probs") -> Path:
    """x float32 [batch,4] → MatMul ``weights`` → Softmax → ``output`` [batch,3]."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], [output], axis=-1)],
        "linear_softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(weights.astype(np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def batches(x: np.ndarray, size: int) -> list[dict[str, np.ndarray]]:
    return [{"x": x[i : i + size]} for i in range(0, len(x), size)]


@pytest.fixture
def data() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(23, 4)).astype(np.float32)


def test_identical_models_agree_exactly(tmp_path: Path, data: np.ndarray) -> None:
    ref = runner_for_onnx(linear_softmax(tmp_path / "a.onnx", WEIGHTS), name="ref")
    same = runner_for_onnx(linear_softmax(tmp_path / "b.onnx", WEIGHTS), name="same")
    [result] = compare_runners(ref, [same], batches(data, 5), kinds=PROBS)
    assert result.runner == "same" and result.samples == 23
    stats = result.outputs["probs"]
    assert (stats.max_abs, stats.max_rel, stats.mean_abs, stats.elements, stats.nonfinite) == (0.0, 0.0, 0.0, 23 * 3, 0)
    assert result.summary("probs")["agreement"] == 1.0 and result.summary("probs")["accuracy"] is None  # no labels, no accuracy


def test_statistics_top1_and_accuracy_match_numpy(tmp_path: Path, data: np.ndarray) -> None:
    changed = WEIGHTS.copy()
    changed[0] += [0.5, 0.0, -0.5]  # moves 4 of the 23 predictions to another class
    ref = runner_for_onnx(linear_softmax(tmp_path / "ref.onnx", WEIGHTS), name="ref")
    cand = runner_for_onnx(linear_softmax(tmp_path / "cand.onnx", changed), name="cand")
    ref_probs, cand_probs = softmax(data.astype(np.float64) @ WEIGHTS), softmax(data.astype(np.float64) @ changed)
    labels = ref_probs.argmax(1)
    labels[:4] = (labels[:4] + 1) % 3  # the reference is wrong on 4 samples

    targets = iter([{"probs": labels[i : i + 4]} for i in range(0, len(labels), 4)])
    [result] = compare_runners(ref, [cand], batches(data, 4), kinds=PROBS, targets=targets)

    diff = np.abs(cand_probs - ref_probs)
    stats = result.outputs["probs"]
    assert stats.elements == diff.size
    assert stats.max_abs == pytest.approx(diff.max(), abs=1e-6)
    assert stats.mean_abs == pytest.approx(diff.mean(), abs=1e-6)
    assert stats.max_rel == pytest.approx((diff / np.maximum(ref_probs, 1e-6)).max(), rel=1e-3)
    agree = (cand_probs.argmax(1) == ref_probs.argmax(1)).mean()
    summary = result.summary("probs")
    assert 0 < agree < 1 and summary["agreement"] == pytest.approx(agree)
    assert summary["reference_accuracy"] == pytest.approx(19 / 23)
    assert summary["accuracy"] == pytest.approx((cand_probs.argmax(1) == labels).mean())
    assert result.tasks["probs"].disagree == round((1 - agree) * 23)  # type: ignore[attr-defined]
    assert result.as_dict()["outputs"]["probs"]["max_abs"] == stats.max_abs
    assert not any(key.startswith("_") for key in result.as_dict())  # running counters stay out of the JSON


def test_every_candidate_gets_its_own_comparison(tmp_path: Path, data: np.ndarray) -> None:
    ref = runner_for_onnx(linear_softmax(tmp_path / "ref.onnx", WEIGHTS), name="ref")
    near = runner_for_onnx(linear_softmax(tmp_path / "near.onnx", WEIGHTS + 0.01), name="near")
    far = runner_for_onnx(linear_softmax(tmp_path / "far.onnx", WEIGHTS * -1.0), name="far")
    results = {c.runner: c for c in compare_runners(ref, [near, far], batches(data, 8), kinds=PROBS)}
    assert set(results) == {"near", "far"}
    assert results["near"].outputs["probs"].max_abs < results["far"].outputs["probs"].max_abs
    assert results["near"].summary("probs")["agreement"] > results["far"].summary("probs")["agreement"]  # type: ignore[operator]


def test_a_tolerance_counts_every_value_past_it_over_all_batches(tmp_path: Path, data: np.ndarray) -> None:
    """``tolerance=(atol, rtol)`` counts, batch after batch, the values past ``atol + rtol·|reference|`` (numpy's allclose)."""
    changed = WEIGHTS.copy()
    changed[0] += [0.02, 0.0, -0.02]
    ref = runner_for_onnx(linear_softmax(tmp_path / "ref.onnx", WEIGHTS), name="ref")
    cand = runner_for_onnx(linear_softmax(tmp_path / "cand.onnx", changed), name="cand")
    atol, rtol = 1e-3, 1e-2
    [result] = compare_runners(ref, [cand], batches(data, 5), tolerance=(atol, rtol))
    ref_probs, cand_probs = softmax(data.astype(np.float64) @ WEIGHTS), softmax(data.astype(np.float64) @ changed)
    past = np.abs(cand_probs - ref_probs) - (atol + rtol * np.abs(ref_probs))
    assert np.abs(past).min() > 1e-5  # no value at the edge, where float32 against float64 could tip it
    expected = int((past > 0).sum())
    stats = result.outputs["probs"]
    assert 0 < expected < stats.elements and stats.beyond == expected
    assert result.as_dict()["outputs"]["probs"]["tolerance"] == (atol, rtol) and result.as_dict()["outputs"]["probs"]["beyond"] == expected
    [plain] = compare_runners(ref, [cand], batches(data, 5))
    assert plain.outputs["probs"].beyond == 0 and "beyond" not in plain.as_dict()["outputs"]["probs"]


def test_different_output_names_are_refused(tmp_path: Path, data: np.ndarray) -> None:
    ref = runner_for_onnx(linear_softmax(tmp_path / "ref.onnx", WEIGHTS), name="ref")
    other = runner_for_onnx(linear_softmax(tmp_path / "other.onnx", WEIGHTS, output="scores"), name="other")
    with pytest.raises(PipelineError, match=r"'other' has outputs \['scores'\] but 'ref' has \['probs'\]") as caught:
        compare_runners(ref, [other], batches(data, 8))
    assert caught.value.fix == "compare models with the same output names"


def test_output_stats_accumulate_over_batches() -> None:
    stats = OutputStats()
    stats.add(np.array([1.0, 2.0]), np.array([1.5, 2.0]))  # diffs 0.5, 0
    stats.add(np.array([0.0]), np.array([0.25]))  # diff 0.25 against a zero reference
    stats.add(np.zeros(0), np.zeros(0))  # an empty batch changes nothing
    assert stats.elements == 3 and stats.max_abs == 0.5
    assert stats.mean_abs == pytest.approx(0.75 / 3)
    assert stats.max_rel == pytest.approx(0.25 / 1e-6)  # relative to the 1e-6 floor, not a division by zero


def test_onnx_runner_with_exact_qdq_quantizes_as_tensorrt_does(tmp_path: Path) -> None:
    """x → QuantizeLinear(scale 0.1, int8) → DequantizeLinear → y: the runner returns round(x / 0.1) · 0.1, saturated."""
    scale, zero = numpy_helper.from_array(np.array(0.1, np.float32), "scale"), numpy_helper.from_array(np.array(0, np.int8), "zero")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]), helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"])],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [scale, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "qdq.onnx"))
    x = np.array([[0.04, 0.26, -0.33, 20.0]], np.float32)
    runner = runner_for_onnx(tmp_path / "qdq.onnx", exact_qdq=True, name="qdq")
    with runner:
        y = runner.infer({"x": x})["y"]
    np.testing.assert_allclose(y, [[0.0, 0.3, -0.3, 12.7]], rtol=0, atol=1e-6)


def test_non_finite_values_are_counted_not_averaged() -> None:
    stats = OutputStats()
    ref = np.array([[1.0, np.nan], [2.0, np.inf], [3.0, 4.0]])
    out = np.array([[1.0, np.nan], [2.0, np.inf], [np.nan, 4.0]])  # the same NaN/Inf as FP32 pass; a new NaN does not
    stats.add(ref, out)
    assert (stats.nonfinite, stats.nonfinite_samples) == (1, 1)
    assert stats.max_abs == 0.0 and np.isfinite(stats.mean_cosine)
    stats.add(np.array([[1.0, 1.0]]), np.array([[-np.inf, 1.0]]))
    assert (stats.nonfinite, stats.nonfinite_samples) == (2, 2)


def test_every_statistic_of_one_output_against_numpy() -> None:
    """What the accuracy and served reports record per output, over two batches with NaN and ±Inf where FP32
    has them too (not counted) and where only the candidate has them (counted, per element and per sample)."""
    ref = np.array([[1.0, -2.0, 0.5, np.nan], [0.0, 0.0, 0.0, 0.0], [3.0, np.inf, -1.0, 2.0]], dtype=np.float32)
    out = np.array([[1.5, -2.0, 0.0, np.nan], [0.0, 0.0, 0.0, 0.0], [3.0, np.inf, np.nan, -np.inf]], dtype=np.float32)
    ref2 = np.array([[2.0, 2.0, 2.0, 2.0]], dtype=np.float32)
    out2 = np.array([[2.0, 2.0, 2.0, 2.5]], dtype=np.float32)
    stats = OutputStats()
    stats.add(ref, out)
    stats.add(ref2, out2)
    both = [(1.0, 1.5), (-2.0, -2.0), (0.5, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (3.0, 3.0), (2.0, 2.0), (2.0, 2.0), (2.0, 2.0), (2.0, 2.5)]
    diffs = np.array([abs(o - r) for r, o in both])
    # per-element statistics over every element, non-finite pairs counted as equal zeros
    assert (stats.nonfinite, stats.nonfinite_samples) == (2, 1)  # −1 → NaN and 2 → −Inf, both in sample 3
    assert stats.elements == 16 and stats.samples == 4
    assert stats.max_abs == 0.5 and stats.mean_abs == pytest.approx(diffs.sum() / 16)
    assert stats.max_rel == pytest.approx(0.5 / 0.5)
    sq_ref = sum(r * r for r, _ in both)
    assert stats.rel_l2 == pytest.approx(math.sqrt((diffs**2).sum() / sq_ref))
    a = [[1.0, -2.0, 0.5, 0.0], [0.0] * 4, [3.0, 0.0, 0.0, 0.0], [2.0] * 4]
    b = [[1.5, -2.0, 0.0, 0.0], [0.0] * 4, [3.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.5]]
    cosines = [1.0 if x == y else float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(a, b)]
    assert stats.mean_cosine == pytest.approx(np.mean(cosines)) and stats.min_cosine == pytest.approx(min(cosines))
    assert sorted(stats.as_dict()) == ["elements", "max_abs", "max_rel", "mean_abs", "mean_cosine", "min_cosine", "nonfinite", "nonfinite_samples",
                                       "rel_l2", "samples"]


def test_a_zero_reference_with_a_changed_candidate_has_relative_error_one() -> None:
    stats = OutputStats()
    stats.add(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32))
    assert stats.rel_l2 == 0.0 and stats.mean_cosine == 1.0
    stats.add(np.zeros((1, 3), np.float32), np.full((1, 3), 1e-3, np.float32))
    assert stats.rel_l2 == 1.0 and stats.samples == 3 and stats.min_cosine == 0.0


def test_a_scalar_per_sample_output_and_shape_mismatch() -> None:
    stats = OutputStats()
    stats.add(np.array([1.0, 2.0, np.nan], np.float32), np.array([1.0, np.nan, np.nan], np.float32))
    assert (stats.nonfinite, stats.nonfinite_samples, stats.samples, stats.min_cosine) == (1, 1, 3, 1.0)
    with pytest.raises(PipelineError, match=r"output shapes differ: \(2, 3\) against the reference's \(2, 2\)") as caught:
        stats.add(np.zeros((2, 2), np.float32), np.zeros((2, 3), np.float32))
    assert caught.value.fix == "compare models with the same outputs"


def test_the_comparison_record_names_runner_samples_and_each_outputs_task_summary() -> None:
    from pipeline.accuracy.compare import new_comparison

    kind = OutputKind("probs", "classes", "test", classes=3)
    comparison = new_comparison("int8-onnx", {"probs": kind}, 0.5)
    probs = np.eye(3, dtype=np.float32)[[0, 1, 2, 0]]
    comparison.add({"probs": probs}, {"probs": probs[[0, 1, 2, 1]]}, {"probs": np.array([0, 1, 2, 0])})
    record = comparison.as_dict()
    assert (record["runner"], record["samples"]) == ("int8-onnx", 4)
    assert record["outputs"]["probs"]["accuracy"] == 0.75 and record["outputs"]["probs"]["reference_accuracy"] == 1.0
    assert record["outputs"]["probs"]["agreement"] == 0.75 and record["outputs"]["probs"]["nonfinite"] == 0


def test_decisions_are_made_at_the_threshold_given(tmp_path: Path, data: np.ndarray) -> None:
    """Read as three independent sigmoid-like scores, the same two models agree or not depending on the threshold."""
    ref = runner_for_onnx(linear_softmax(tmp_path / "ref.onnx", WEIGHTS), name="ref")
    cand = runner_for_onnx(linear_softmax(tmp_path / "cand.onnx", WEIGHTS * 1.3), name="cand")
    tags = {"probs": OutputKind("probs", "multilabel", "test", classes=3)}
    cut = {t: compare_runners(ref, [cand], batches(data, 8), kinds=tags, threshold=t)[0].summary("probs")["agreement"] for t in (0.2, 0.5)}
    p_ref, p_cand = softmax(data @ WEIGHTS), softmax(data @ (WEIGHTS * 1.3))
    assert cut == {t: pytest.approx(float(((p_ref > t) == (p_cand > t)).mean())) for t in (0.2, 0.5)} and cut[0.2] != cut[0.5]


def test_non_finite_values_count_where_the_two_differ() -> None:
    """+Inf against −Inf, NaN against Inf and a number against NaN are three mismatches in three samples; the
    same ±Inf or NaN in both is none."""
    stats = OutputStats()
    ref = np.array([[np.inf], [np.nan], [np.inf], [1.0], [np.nan]], dtype=np.float32)
    out = np.array([[-np.inf], [np.inf], [np.inf], [np.nan], [np.nan]], dtype=np.float32)
    stats.add(ref, out)
    assert (stats.nonfinite, stats.nonfinite_samples) == (3, 3)


def test_small_values_keep_their_relative_error_and_cosine() -> None:
    """Vectors and sums of squares below 1 are not special: rel L2 and cosine are the plain ratios."""
    stats = OutputStats()
    ref, out = np.array([[0.1, 0.2]], np.float32), np.array([[0.2, 0.1]], np.float32)
    stats.add(ref, out)
    r, o = ref.astype(np.float64)[0], out.astype(np.float64)[0]
    assert stats.rel_l2 == pytest.approx(np.linalg.norm(o - r) / np.linalg.norm(r))
    assert stats.mean_cosine == pytest.approx(r @ o / (np.linalg.norm(r) * np.linalg.norm(o)))


def test_a_float16_reference_is_held_to_float16s_spacing_at_each_samples_scale() -> None:
    """The issue's numbers: logits near 30 computed in float16 (spacing 0.0156 between 16 and 32) differ by 0.0108 from
    a float32 conversion; atol 1e-4 + rtol 1e-5 alone fails that, 4 float16 spacings at the sample's largest |value|
    pass it (near-zero logits of that sample too), and a wrong value (0.1 off) still fails."""
    import numpy as np

    from pipeline.accuracy.compare import OutputStats, format_spacing

    assert format_spacing("float16", np.array([30.0, 1.0, 1e-9])).tolist() == [2.0**-6, 2.0**-10, 2.0**-24]
    assert format_spacing("bfloat16", np.array([30.0])).tolist() == [2.0**-3]
    ref = np.array([[30.0, -12.0, 0.001], [0.5, 0.25, -0.125]], np.float32)
    close = ref + np.array([[0.0108, -0.0108, 0.0108], [0.0, 0.0, 0.0]], np.float32)
    plain, narrow = OutputStats(tolerance=(1e-4, 1e-5)), OutputStats(tolerance=(1e-4, 1e-5), reference_format="float16", ulps=4.0)
    plain.add(ref, close)
    narrow.add(ref, close)
    assert plain.beyond == 3 and narrow.beyond == 0
    wrong = OutputStats(tolerance=(1e-4, 1e-5), reference_format="float16", ulps=4.0)
    wrong.add(ref, ref + np.array([[0.1, 0.0, 0.0], [0.0, 0.01, 0.0]], np.float32))  # the second sample's scale is 0.5: 4 spacings 0.002
    assert wrong.beyond == 2
