"""The served checks fail when what Triton serves differs: judged on arrays, as ``verify`` judges what it got back.

``served_against_inprocess`` (served vs the same file in process) and ``gate_against_fp32`` (a served
variant vs served FP32, by kind) are the functions ``verify_repository`` calls on Triton's answers;
tests/triton/test_verify.py runs them through a real server.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.accuracy.compare import new_comparison
from pipeline.accuracy.gates import Gates
from pipeline.accuracy.outputkinds import OutputKind
from pipeline.triton.served_gate import ServedResult, gate_against_fp32, results_as_json, served_against_inprocess

KINDS = {"probs": OutputKind("probs", "classes", "test", classes=10), "score": OutputKind("score", "regression", "test")}
ATOL = 1e-3


def batches(rng: np.random.Generator, n: int = 600) -> list[dict[str, np.ndarray]]:
    return [{"probs": rng.random((100, 10)).astype(np.float32), "score": rng.normal(size=(100, 1)).astype(np.float32)} for _ in range(n // 100)]


def check(inprocess: list[dict[str, np.ndarray]], served: list[dict[str, np.ndarray]]) -> tuple[dict, list[str]]:
    comparison = new_comparison("digits_int8", KINDS, 0.5)
    for mine, theirs in zip(inprocess, served, strict=True):
        comparison.add(mine, theirs, {})
    return served_against_inprocess(comparison, KINDS, ATOL)


def test_served_equal_to_in_process_passes_and_reports_every_output() -> None:
    rng = np.random.default_rng(1)
    data = batches(rng)
    outputs, failures = check(data, [{k: v + np.float32(ATOL / 2) for k, v in b.items()} for b in data])
    assert failures == []
    assert outputs["probs"]["kind"] == "classes" and outputs["probs"]["agreement"] == 1.0 and outputs["probs"]["nonfinite"] == 0
    assert outputs["score"]["max_abs_diff"] == pytest.approx(ATOL / 2, rel=1e-3)


def test_a_served_difference_beyond_atol_fails() -> None:
    rng = np.random.default_rng(2)
    data = batches(rng)
    served = [dict(b) for b in data]
    served[3] = {**data[3], "score": data[3]["score"] + np.float32(0.01)}
    outputs, failures = check(data, served)
    assert failures == ["output 'score' served differs from in-process by up to 0.01 (> 0.001)"]
    assert outputs["score"]["max_abs_diff"] == pytest.approx(0.01, rel=1e-3)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_served_where_in_process_is_finite_fails(bad: float) -> None:
    """A NaN compares as no difference in the max-abs statistic: only the non-finite count catches it."""
    rng = np.random.default_rng(3)
    data = batches(rng)
    served = [dict(b) for b in data]
    probs = data[0]["probs"].copy()
    probs[5, 2] = bad
    served[0] = {**data[0], "probs": probs}
    outputs, failures = check(data, served)
    assert failures == ["output 'probs': 1 NaN/Inf values served where in-process ones are finite"]
    assert outputs["probs"]["nonfinite"] == 1 and outputs["probs"]["max_abs_diff"] == 0.0


def served_result(model: str, served: list[dict[str, np.ndarray]], targets: list[dict[str, np.ndarray]]) -> ServedResult:
    base, precision = model.rsplit("_", 1)
    return ServedResult(model, base, precision, 1, 600, {}, [], kinds=dict(KINDS), served=served, targets=targets)


def one_hot(classes: np.ndarray) -> np.ndarray:
    return np.eye(10, dtype=np.float32)[classes]


def test_a_served_variant_worse_than_served_fp32_fails_and_an_equal_one_passes() -> None:
    rng = np.random.default_rng(4)
    truth = [rng.integers(0, 10, 100) for _ in range(6)]
    score = [rng.normal(size=(100, 1)).astype(np.float32) for _ in range(6)]
    fp32 = [{"probs": one_hot(t), "score": s} for t, s in zip(truth, score)]
    worse = [{"probs": one_hot((t + (i < 2)) % 10), "score": s} for i, (t, s) in enumerate(zip(truth, score))]  # a third wrong
    targets = [{"probs": t} for t in truth]
    gates = Gates(int8_atol=None)
    results = [served_result("digits_fp32", fp32, targets), served_result("digits_int8", worse, targets), served_result("digits_fp16", fp32, targets)]
    gate_against_fp32(results, {r.model: gates for r in results})
    fp32_result, int8, fp16 = results
    assert len(int8.failures) == 1 and int8.failures[0].startswith("served vs served FP32: output 'probs' (classes): accuracy drop (top-1) 33.33 points")
    assert {r["metric"]: r["verdict"] for r in int8.gates if r["output"] == "probs"} == {"accuracy drop (top-1)": "fail"}
    assert fp16.failures == [] and fp16.gates and all(r["verdict"] in ("pass", "reported") for r in fp16.gates)
    assert fp32_result.gates == [] and fp32_result.failures == []  # FP32 is the reference, not judged against itself
    rows = {r["model"]: r for r in results_as_json(results)}
    assert not rows["digits_int8"]["passed"] and rows["digits_fp16"]["passed"] and "served" not in rows["digits_int8"]


def test_a_served_variant_with_nan_where_served_fp32_is_finite_fails() -> None:
    rng = np.random.default_rng(5)
    fp32 = batches(rng)
    broken = [dict(b) for b in fp32]
    score = fp32[2]["score"].copy()
    score[0, 0] = np.nan
    broken[2] = {**fp32[2], "score": score}
    results = [served_result("m_fp32", fp32, [{}] * 6), served_result("m_fp16", broken, [{}] * 6)]
    gate_against_fp32(results, {r.model: Gates() for r in results})
    assert results[1].failures == ["served vs served FP32: output 'score' (regression): 1 NaN/Inf values in 1 samples where FP32 has finite ones"]


def test_a_variant_fed_other_values_than_the_samples_is_judged_against_fp32_on_those_values() -> None:
    """A uint8-input variant computes on its samples rounded to uint8: it is judged against served FP32 on the same
    rounded values (``fp32_on_same_values``), not against FP32 on the unrounded samples, and is then caught when it
    answers something else."""
    rng = np.random.default_rng(7)
    truth = [rng.integers(0, 10, 100) for _ in range(6)]
    targets = [{"probs": t} for t in truth]
    on_samples = [{"probs": one_hot(t), "score": rng.normal(size=(100, 1)).astype(np.float32)} for t in truth]
    on_rounded = [{"probs": b["probs"] * np.float32(0.9) + np.float32(0.01), "score": b["score"] + np.float32(0.05)} for b in on_samples]
    fp32, u8 = served_result("m_fp32", on_samples, targets), served_result("m_u8", on_rounded, targets)
    gates = {"m_fp32": Gates(), "m_u8": Gates()}
    gate_against_fp32([fp32, u8], gates)
    assert u8.failures and all(f.startswith("served vs served FP32: ") for f in u8.failures)  # 0.1 off the unrounded samples' FP32
    u8 = served_result("m_u8", on_rounded, targets)
    u8.fp32_on_same_values = [dict(b) for b in on_rounded]
    gate_against_fp32([fp32, u8], gates)
    assert u8.failures == [] and u8.gates and all(r["verdict"] in ("pass", "reported") for r in u8.gates)
    wrong = served_result("m_u8", [{**b, "probs": np.roll(b["probs"], 1, axis=1)} for b in on_rounded], targets)
    wrong.fp32_on_same_values = [dict(b) for b in on_rounded]
    gate_against_fp32([fp32, wrong], gates)
    assert any("accuracy drop (top-1) 100.00 points" in f for f in wrong.failures), wrong.failures
    assert "fp32_on_same_values" not in results_as_json([wrong])[0]


def test_variants_verified_on_different_data_are_noted_not_compared() -> None:
    rng = np.random.default_rng(6)
    fp32 = batches(rng)
    results = [served_result("m_fp32", fp32, [{}] * 6), served_result("m_int8", fp32[:3], [{}] * 3), served_result("m_fp16", fp32, [{}] * 6)]
    gate_against_fp32(results, {r.model: Gates() for r in results})
    assert results[1].failures == [] and results[1].notes == ["served vs served FP32: not compared (the two were verified on different data)"]
    assert results[2].gates and results[2].failures == []  # the variant after it is judged all the same


def test_the_served_rows_name_both_task_metrics_and_a_difference_at_atol_passes() -> None:
    """The served table shows the served and in-process task metric side by side; ``atol`` itself is within."""
    truth = np.arange(200) % 10
    inprocess = np.eye(10, dtype=np.float32)[truth]
    served = inprocess.copy()
    served[:20] = np.roll(served[:20], 1, axis=1)  # 20 of 200 served answers are wrong
    served[50, 0] += np.float32(0.5)  # exactly atol
    comparison = new_comparison("m_int8", {"probs": KINDS["probs"]}, 0.5)
    comparison.add({"probs": inprocess}, {"probs": served}, {"probs": truth})
    outputs, failures = served_against_inprocess(comparison, {"probs": KINDS["probs"]}, 1.0)
    assert outputs == {"probs": {"kind": "classes", "max_abs_diff": 1.0, "nonfinite": 0, "agreement": 0.9, "served_metric": 0.9, "inprocess_metric": 1.0}}
    assert failures == []
    assert served_against_inprocess(comparison, {"probs": KINDS["probs"]}, 0.5)[1] == ["output 'probs' served differs from in-process by up to 1 (> 0.5)"]


def test_every_variant_is_judged_after_one_verified_on_other_data_and_earlier_failures_stay() -> None:
    rng = np.random.default_rng(7)
    kinds = {"flag": OutputKind("flag", "binary", "test")}  # a binary output: judged at the recorded threshold
    flag = [rng.random((100, 1)).astype(np.float32) for _ in range(3)]
    fp32 = [{"flag": f} for f in flag]
    flipped = [{"flag": 1 - f} for f in flag]
    results = [ServedResult(m, "m", p, 1, 300, {}, [], kinds=kinds, served=s, targets=[{}] * len(s))
               for m, p, s in (("m_fp32", "fp32", fp32), ("m_int8", "int8", fp32[:2]), ("m_fp16", "fp16", flipped))]
    results[2].failures.append("output 'flag' served differs from in-process by up to 1 (> 0.001)")
    gate_against_fp32(results, {r.model: Gates() for r in results})
    assert results[1].notes == ["served vs served FP32: not compared (the two were verified on different data)"]
    assert results[2].failures[0] == "output 'flag' served differs from in-process by up to 1 (> 0.001)"  # kept
    assert results[2].failures[1].startswith("served vs served FP32: output 'flag' (binary): decision disagreement 100.00 points")
    assert results[2].notes == []
    rows = results_as_json(results)
    assert sorted(rows[2]) == ["base", "failures", "gates", "model", "notes", "outputs", "passed", "precision", "samples", "version"]


def test_an_undecided_served_gate_is_a_note_not_a_failure() -> None:
    rng = np.random.default_rng(8)
    kinds = {"flag": OutputKind("flag", "binary", "test")}
    flag = rng.random((100, 1)).astype(np.float32)
    moved = flag.copy()
    moved[0] = 1 - moved[0]  # one decision of 100 changes: the set cannot judge a 1-point limit
    results = [ServedResult(m, "m", p, 1, 100, {}, [], kinds=kinds, served=[{"flag": s}], targets=[{}])
               for m, p, s in (("m_fp32", "fp32", flag), ("m_int8", "int8", moved))]
    gate_against_fp32(results, {r.model: Gates() for r in results})
    assert results[1].failures == [] and len(results[1].notes) == 1
    assert results[1].notes[0].startswith("served vs served FP32: not enough evaluation data to judge a 1-point limit: output 'flag' (binary)")


def _with_metric(model: str, precision: str, probs: float | None) -> ServedResult:
    outputs = {"probs": {"kind": "classes", "served_metric": probs, "agreement": 1.0}}
    return ServedResult(model, "digits", precision, 1, 449, outputs, [])


def test_mlperfs_accuracy_target_is_a_share_of_served_fp32s_metric_and_needs_labels() -> None:
    """NVIDIA's H200 ResNet50 INT8 result, 76.08 % top-1 against the 76.46 % reference, passes 99 % (75.70) and
    fails 99.9 % (76.38); an output without labels has no task metric, which a note says instead of a verdict."""
    from pipeline.triton.served_gate import against_share_of_fp32

    for share, verdict in ((0.99, "pass"), (0.999, "fail")):
        results = [_with_metric("digits_fp32", "fp32", 0.7646), _with_metric("digits_int8", "int8", 0.7608)]
        against_share_of_fp32(results, share)
        fp32, int8 = results
        assert fp32.gates == [] and fp32.failures == []
        (row,) = int8.gates
        assert (row["verdict"], row["value"], row["fp32"], row["worse"]) == (verdict, 0.7608, 0.7646, "lower")
        assert row["limit"] == pytest.approx(share * 0.7646)
        assert int8.failures == ([] if verdict == "pass" else
                                 ["MLPerf accuracy target: output 'probs' (classes): 0.7608 < 99.9% of served FP32's 0.7646 (0.7638)"])
    unlabeled = [_with_metric("digits_fp32", "fp32", None), _with_metric("digits_int8", "int8", None)]
    against_share_of_fp32(unlabeled, 0.99)
    assert unlabeled[1].gates == [] and unlabeled[1].failures == []
    assert unlabeled[1].notes == ["MLPerf accuracy target: output 'probs': no labels, so no task metric to hold to 99.0% of FP32's"]


@pytest.mark.parametrize(("text", "share"), [("99%", 0.99), ("99.9%", 0.999), ("0.99", 0.99), (" 100% ", 1.0)])
def test_an_accuracy_target_reads_as_a_percentage_or_a_share(text: str, share: float) -> None:
    from pipeline.accuracy.gates import accuracy_share

    assert accuracy_share(text) == pytest.approx(share)


@pytest.mark.parametrize("text", ["0", "0%", "101%", "1.5", "-99%", "nan", "ninety", ""])
def test_an_accuracy_target_outside_0_to_100_percent_is_refused(text: str) -> None:
    from pipeline.accuracy.gates import accuracy_share
    from pipeline.core.errors import PipelineError

    with pytest.raises(PipelineError, match="is not a share of FP32's metric"):
        accuracy_share(text)


def test_mlperfs_target_is_not_stated_without_served_fp32_on_the_same_samples_and_exactly_the_share_passes() -> None:
    from dataclasses import replace

    from pipeline.triton.served_gate import against_share_of_fp32

    alone = [_with_metric("digits_int8", "int8", 0.50)]
    against_share_of_fp32(alone, 0.99)
    assert alone[0].gates == [] and alone[0].failures == []
    assert alone[0].notes == ["MLPerf accuracy target: not stated: no served digits_fp32 verified beside it; verify both on the same data"]
    other = [_with_metric("digits_fp32", "fp32", 0.9), replace(_with_metric("digits_int8", "int8", 0.5), samples=100)]
    against_share_of_fp32(other, 0.99)
    assert other[1].failures == [] and other[1].notes == [
        "MLPerf accuracy target: not stated: served FP32 was verified on other samples; verify both on the same data"]
    # 46134 of 50000 correct is exactly 99% of 46600 of 50000, which float arithmetic puts a hair below 0.99 × 0.932
    exact = [_with_metric("digits_fp32", "fp32", 46600 / 50000), _with_metric("digits_int8", "int8", 46134 / 50000)]
    assert 46134 / 50000 < 0.99 * (46600 / 50000)
    against_share_of_fp32(exact, 0.99)
    assert exact[1].failures == [] and exact[1].gates[0]["verdict"] == "pass"


def test_a_variant_below_mlperfs_target_is_told_how_to_rebuild_it() -> None:
    from pipeline.triton.served_gate import against_share_of_fp32
    from pipeline.triton.verify import _fix_for

    results = [_with_metric("digits_fp32", "fp32", 0.7750), _with_metric("digits_int8", "int8", 0.7733)]
    against_share_of_fp32(results, 0.999)
    assert results[1].failures and "rebuild it with a lower --int8-max-drop" in _fix_for([results[1]])
