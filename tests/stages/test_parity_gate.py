"""The parity gate's verdict on arrays: ONNX must compute what TensorFlow computes (pipeline.stages.parity).

tests/stages/test_conversion.py runs it on real TensorFlow and ONNX Runtime models (slow); here the
comparison is fed arrays, so each way the gate must fail is shown on its own.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.accuracy.compare import Comparison
from pipeline.stages.parity import parity_failures


def compared(ref: np.ndarray, out: np.ndarray) -> Comparison:
    comparison = Comparison("onnxruntime")
    comparison.add({"y": ref}, {"y": out}, {})
    return comparison


def test_equal_outputs_pass_and_a_difference_past_atol_fails() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(64, 8)).astype(np.float32)
    assert parity_failures(compared(ref, ref + np.float32(5e-5)), atol=1e-4, rtol=0.0) == []
    out = ref.copy()
    out[3, 4] += 2e-4
    assert parity_failures(compared(ref, out), atol=1e-4, rtol=0.0) == ["output 'y' max abs diff 0.0002 > atol 0.0001"]


def test_rtol_forgives_a_difference_that_is_small_against_the_value() -> None:
    ref = np.full((4, 2), 1000.0, dtype=np.float32)
    out = ref + np.float32(0.5)  # 0.5 absolute, 5e-4 relative
    assert parity_failures(compared(ref, out), atol=1e-4, rtol=1e-3) == []
    assert parity_failures(compared(ref, out), atol=1e-4, rtol=1e-4) == ["output 'y' max abs diff 0.5 > atol 0.0001"]
    assert parity_failures(compared(ref, out), atol=0.5, rtol=0.0) == []  # at atol exactly: within


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_where_tensorflow_is_finite_fails(bad: float) -> None:
    ref = np.ones((8, 3), dtype=np.float32)
    out = ref.copy()
    out[2, 1] = bad
    assert parity_failures(compared(ref, out), atol=1.0, rtol=0.0) == ["output 'y' has 1 NaN/Inf values in 1 samples where TensorFlow's are finite"]
    assert parity_failures(compared(out, out), atol=1.0, rtol=0.0) == []  # the same NaN in both: the conversion kept it


def test_a_difference_exactly_at_rtol_passes() -> None:
    ref = np.full((4, 2), 1000.0, dtype=np.float32)
    assert parity_failures(compared(ref, ref + np.float32(0.5)), atol=1e-4, rtol=0.5 / 1000.0) == []  # within rtol, itself included


def test_the_default_tolerance_passes_float32_summed_in_another_order_and_fails_a_dropped_bias() -> None:
    """Outputs near 300 that TensorFlow (oneDNN) and ONNX Runtime sum in another order on an AMX CPU differ by four
    float32 spacings (1.22e-4, 3.5e-7 of the value): past the default atol alone, within the default rtol. A bias of
    0.05 left out of the graph is not."""
    from pipeline.accuracy.gates import Gates

    gates = Gates()
    ref = np.linspace(250.0, 350.0, 64, dtype=np.float32).reshape(16, 4)
    reordered = ref + 4 * np.spacing(ref)
    assert parity_failures(compared(ref, reordered), atol=gates.parity_atol, rtol=gates.parity_rtol) == []
    assert parity_failures(compared(ref, reordered), atol=gates.parity_atol, rtol=0.0) != []  # what the old default said
    no_bias = ref - np.float32(0.05)
    assert parity_failures(compared(ref, no_bias), atol=gates.parity_atol, rtol=gates.parity_rtol) == [
        "output 'y' max abs diff 0.05 > atol 0.0001"]
