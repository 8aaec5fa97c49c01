"""The parity gate's verdict on arrays: ONNX must compute what TensorFlow computes (pipeline.stages.parity).

tests/stages/test_conversion.py runs it on real TensorFlow and ONNX Runtime models (slow); here the
comparison is fed arrays, so each way the gate must fail is shown on its own.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.compare import Comparison
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
