"""``--output-kind NAME=KIND`` is honoured for every numeric dtype, and refused in one line for the others."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.accuracy.outputkinds import KINDS, decide_kinds
from pipeline.core.errors import PipelineError
from pipeline.data.tensors import ModelSignature, TensorSpec

NUMERIC = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.bool_]


def signature(dtype: type, shape: tuple = (-1, 4)) -> ModelSignature:
    return ModelSignature((), (TensorSpec("out", np.dtype(dtype), shape),))


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
def test_an_override_is_honoured_for_every_numeric_dtype(dtype: type, kind: str) -> None:
    [decided] = decide_kinds(signature(dtype), described=None, producers={}, overrides={"out": kind}).values()
    assert (decided.kind, decided.why) == (kind, "--output-kind")
    float_logits = np.dtype(dtype).kind == "f" and kind in ("binary", "multilabel")
    assert decided.logits is float_logits  # a linear float output's scores are logits; integers and booleans never are


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_], ids=lambda d: np.dtype(d).name)
def test_without_an_override_integer_and_boolean_outputs_are_compared_as_numbers(dtype: type) -> None:
    [decided] = decide_kinds(signature(dtype), described=None, producers={}, overrides={}).values()
    assert decided.kind == "regression" and decided.why == f"{np.dtype(dtype)} values, compared as numbers"


@pytest.mark.parametrize("dtype", [np.str_, np.object_, np.complex64], ids=lambda d: np.dtype(d).name)
def test_an_override_on_an_output_no_kind_can_judge_is_one_line(dtype: type) -> None:
    with pytest.raises(PipelineError) as caught:
        decide_kinds(signature(dtype), described=None, producers={}, overrides={"out": "classes"})
    assert "--output-kind out=classes: output 'out' holds" in str(caught.value) and "\n" not in str(caught.value)
    assert "only numeric outputs (float, integer, bool) take a kind" in caught.value.fix
