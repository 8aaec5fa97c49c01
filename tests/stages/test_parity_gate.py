"""The parity gate's verdict on arrays: ONNX must compute what TensorFlow computes (pipeline.stages.parity).

tests/stages/test_conversion.py runs it on real TensorFlow and ONNX Runtime models (slow); here the
comparison is fed arrays, so each way the gate must fail is shown on its own.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.accuracy.compare import Comparison
from pipeline.stages.parity import parity_failures


def compared(ref: np.ndarray, out: np.ndarray, *, atol: float, rtol: float) -> Comparison:
    comparison = Comparison("onnxruntime", tolerance=(atol, rtol))
    comparison.add({"y": ref}, {"y": out}, {})
    return comparison


def test_equal_outputs_pass_and_a_difference_past_atol_fails() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(64, 8)).astype(np.float32)
    assert parity_failures(compared(ref, ref + np.float32(5e-5), atol=1e-4, rtol=0.0)) == []
    out = ref.copy()
    out[3, 4] += 2e-4
    assert parity_failures(compared(ref, out, atol=1e-4, rtol=0.0)) == [
        "output 'y' has 1 of 512 values farther than atol 0.0001 + rtol 0·|TensorFlow| (max abs diff 0.0002)"]


def test_rtol_forgives_a_difference_that_is_small_against_the_value() -> None:
    ref = np.full((4, 2), 1000.0, dtype=np.float32)
    out = ref + np.float32(0.5)  # 0.5 absolute, 5e-4 relative
    assert parity_failures(compared(ref, out, atol=1e-4, rtol=1e-3)) == []
    assert parity_failures(compared(ref, out, atol=1e-4, rtol=1e-4)) == [
        "output 'y' has 8 of 8 values farther than atol 0.0001 + rtol 0.0001·|TensorFlow| (max abs diff 0.5)"]
    assert parity_failures(compared(ref, out, atol=0.5, rtol=0.0)) == []  # at atol exactly: within


def test_each_value_is_held_to_its_own_magnitude() -> None:
    """Outputs from 0 to 300, each summed in another order: every value within atol + rtol·|value|, although the
    largest absolute difference (at 300) is past atol and the largest relative one (near 0) past rtol."""
    ref = np.array([[0.001, 1.0, 30.0, 300.0]], dtype=np.float32)
    out = ref + np.array([[5e-5, 0.0, 0.0, 1.2e-4]], dtype=np.float32)
    assert parity_failures(compared(ref, out, atol=1e-4, rtol=1e-5)) == []
    out[0, 1] += 1e-3  # one value wrong by 1e-3 at 1.0: past 1e-4 + 1e-5
    assert parity_failures(compared(ref, out, atol=1e-4, rtol=1e-5)) == [
        "output 'y' has 1 of 4 values farther than atol 0.0001 + rtol 1e-05·|TensorFlow| (max abs diff 0.001)"]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_where_tensorflow_is_finite_fails(bad: float) -> None:
    ref = np.ones((8, 3), dtype=np.float32)
    out = ref.copy()
    out[2, 1] = bad
    assert parity_failures(compared(ref, out, atol=1.0, rtol=0.0)) == ["output 'y' has 1 NaN/Inf values in 1 samples where TensorFlow's are finite"]
    assert parity_failures(compared(out, out, atol=1.0, rtol=0.0)) == []  # the same NaN in both: the conversion kept it


def test_a_difference_exactly_at_rtol_passes() -> None:
    ref = np.full((4, 2), 1000.0, dtype=np.float32)
    assert parity_failures(compared(ref, ref + np.float32(0.5), atol=0.0, rtol=0.5 / 1000.0)) == []  # within rtol, itself included


def test_the_default_tolerance_passes_float32_summed_in_another_order_and_fails_a_wrong_output() -> None:
    """Outputs near 300 that TensorFlow (oneDNN) and ONNX Runtime sum in another order on an AMX CPU differ by four
    float32 spacings (1.22e-4, 3.5e-7 of the value): past the default atol alone, within the default tolerance. A
    bias of 0.05 left out of the graph, an output scaled by 1.001 or flipped in sign is not."""
    from pipeline.accuracy.gates import Gates

    gates = Gates()
    ref = np.linspace(250.0, 350.0, 64, dtype=np.float32).reshape(16, 4)
    reordered = ref + 4 * np.spacing(ref)
    assert parity_failures(compared(ref, reordered, atol=gates.parity_atol, rtol=gates.parity_rtol)) == []
    assert parity_failures(compared(ref, reordered, atol=gates.parity_atol, rtol=0.0)) != []  # what rtol 0 said
    for wrong in (ref - np.float32(0.05), ref * np.float32(1.001), -ref):
        [failure] = parity_failures(compared(ref, wrong, atol=gates.parity_atol, rtol=gates.parity_rtol))
        assert failure.startswith("output 'y' has 64 of 64 values farther than atol 0.0001 + rtol 1e-05·|TensorFlow|")


def test_every_output_is_judged() -> None:
    ref = {"a": np.ones((4, 2), np.float32), "b": np.full((4, 3), 7.0, np.float32)}
    out = {"a": ref["a"].copy(), "b": ref["b"] + np.float32(0.01)}
    comparison = Comparison("onnxruntime", tolerance=(1e-4, 1e-5))
    comparison.add(ref, out, {})
    assert [f.split(" has")[0] for f in parity_failures(comparison)] == ["output 'b'"]


def test_without_a_tolerance_nothing_is_counted_or_reported() -> None:
    comparison = Comparison("onnxruntime")
    comparison.add({"y": np.zeros(3, np.float32)}, {"y": np.ones(3, np.float32)}, {})
    assert comparison.outputs["y"].beyond == 0 and "beyond" not in comparison.outputs["y"].as_dict()
