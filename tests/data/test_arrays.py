"""Model-input arrays: checked against the model's inputs, named after what they are in messages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.data.arrays import checked_inputs, load_npz
from pipeline.data.tensors import ModelSignature, TensorSpec

SIGNATURE = ModelSignature(
    inputs=(TensorSpec("image", np.dtype(np.float32), ("batch", 8, 8, 1)), TensorSpec("ids", np.dtype(np.int64), ("batch", "ids_dim1"))),
    outputs=(TensorSpec("probs", np.dtype(np.float32), ("batch", 10)),),
)


def test_labels_are_ignored_and_arrays_pass_through() -> None:
    arrays = {"image": np.zeros((3, 8, 8, 1), np.float32), "ids": np.ones((3, 5), np.int32), "labels": np.arange(3)}
    checked = checked_inputs(Path("eval.npz"), arrays, SIGNATURE, what="evaluation data")
    assert set(checked) == {"image", "ids"} and checked["ids"].shape == (3, 5)


@pytest.mark.parametrize(
    ("arrays", "expected"),
    [
        ({"image": np.zeros((3, 8, 8, 1), np.float32)}, "evaluation data 'eval.npz' has no array for model input(s) ['ids']"),
        ({"image": np.zeros((3, 8, 8, 1), np.float32), "ids": np.ones((2, 5), np.int64)}, "different sample counts"),
        ({"image": np.full((3, 8, 8, 1), np.inf, np.float32), "ids": np.ones((3, 5), np.int64)}, "192 NaN/Inf"),
        ({"image": np.zeros((3, 8, 8, 1), np.float32), "ids": np.ones((3, 5), np.float32)}, "is float32, but the model input is int64"),
    ],
)
def test_bad_arrays_name_the_problem(arrays: dict[str, np.ndarray], expected: str) -> None:
    with pytest.raises(PipelineError) as err:
        checked_inputs(Path("eval.npz"), arrays, SIGNATURE, what="evaluation data")
    assert expected in str(err.value)


def test_pickled_npz_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "objects.npz"
    np.savez(path, image=np.array([{"a": 1}], dtype=object))
    with pytest.raises(PipelineError, match="pickled object array"):
        load_npz(path)
