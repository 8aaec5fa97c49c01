"""The zoo harness reads each variant's verdict from the accuracy report itself: a report without it fails."""

from __future__ import annotations

import pytest

from tests.zoo.harness import _gates


def test_a_variant_without_its_verdict_is_an_error_not_a_pass() -> None:
    with pytest.raises(AssertionError, match="'int8-onnx' has no boolean 'passed' field"):
        _gates({"variants": [{"variant": "int8-onnx", "precision": "int8", "failures": [], "rows": []}]})


def test_the_recorded_verdict_is_taken_as_it_is() -> None:
    gates = _gates({"variants": [{"variant": "int8-onnx", "precision": "int8", "passed": False, "failures": [], "rows": []},
                                 {"variant": "fp16-onnx", "precision": "fp16", "passed": True, "failures": [], "rows": []}]})
    assert gates["int8"]["passed"] is False and gates["fp16"]["passed"] is True
