"""Evaluation data (pipeline/accuracy/evaldata.py): eval.npz read against a model's signature, and seeded synthetic samples."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pipeline.accuracy.evaldata import eval_data_from_npz, synthetic_eval_data
from pipeline.core.errors import PipelineError
from pipeline.data.tensors import ModelSignature, TensorSpec

SIGNATURE = ModelSignature(
    inputs=(TensorSpec("image", np.dtype(np.float32), ("batch", 4, 4, 1)), TensorSpec("ids", np.dtype(np.int64), ("batch", "ids_dim1"))),
    outputs=(TensorSpec("probs", np.dtype(np.float32), ("batch", 3)),),
)


def write(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_npz_with_labels_loads_in_the_model_dtypes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    image, ids = rng.random((5, 4, 4, 1)).astype(np.float32), rng.integers(0, 9, (5, 7)).astype(np.int32)
    path = write(tmp_path / "eval.npz", image=image, ids=ids, labels=np.arange(5, dtype=np.int32))
    data = eval_data_from_npz(path, SIGNATURE)
    assert data.num_samples == 5 and data.source == str(path)
    assert data.inputs["ids"].dtype == np.int64 and data.inputs["image"].dtype == np.float32  # int32 ids widened to the model's int64
    np.testing.assert_array_equal(data.inputs["ids"], ids)
    assert data.labels is not None and data.labels.dtype == np.int64 and data.labels.tolist() == [0, 1, 2, 3, 4]
    # the stage cache keys on the file: the same bytes give the same fingerprint, other bytes another
    assert eval_data_from_npz(path, SIGNATURE).fingerprint == data.fingerprint
    other = write(tmp_path / "other.npz", image=image, ids=ids, labels=np.array([0, 1, 2, 3, 3]))
    assert eval_data_from_npz(other, SIGNATURE).fingerprint != data.fingerprint


def test_without_labels_is_unlabeled(tmp_path: Path) -> None:
    path = write(tmp_path / "eval.npz", image=np.zeros((2, 4, 4, 1), np.float32), ids=np.zeros((2, 3), np.int64))
    assert eval_data_from_npz(path, SIGNATURE).labels is None


@pytest.mark.parametrize(
    ("labels", "message"),
    [(np.zeros(4, np.int64), "'labels' in '{path}' has 4 samples but the inputs have 5"),
     (np.array([0.0, 1.0, np.nan, 2.0, 3.0], np.float32), "label array 'labels' in '{path}' has 1 NaN/Inf values"),
     (np.array(["a"] * 5), "label array 'labels' in '{path}' holds <U1 (5,)")],
    ids=["too-few", "nan", "strings"],
)
def test_bad_labels_are_refused_when_read(tmp_path: Path, labels: np.ndarray, message: str) -> None:
    path = write(tmp_path / "eval.npz", image=np.zeros((5, 4, 4, 1), np.float32), ids=np.zeros((5, 3), np.int64), labels=labels)
    with pytest.raises(PipelineError, match=re.escape(message.format(path=path))):
        eval_data_from_npz(path, SIGNATURE)


def test_labels_per_output_are_kept_apart(tmp_path: Path) -> None:
    path = write(tmp_path / "eval.npz", image=np.zeros((5, 4, 4, 1), np.float32), ids=np.zeros((5, 3), np.int64),
                 **{"labels:cls": np.arange(5), "labels:box": np.ones((5, 4), np.float64)})
    data = eval_data_from_npz(path, SIGNATURE)
    assert data.labels is None and data.target_names == ["box", "cls"]
    assert data.targets_of("box").dtype == np.float32 and data.targets_of("cls").dtype == np.int64
    [first, second] = list(data.target_batches(3))
    assert first["cls"].tolist() == [0, 1, 2] and second["box"].shape == (2, 4)


def test_inputs_are_checked_against_the_signature(tmp_path: Path) -> None:
    path = write(tmp_path / "eval.npz", image=np.zeros((5, 4, 4, 1), np.float32), labels=np.zeros(5, np.int64))
    with pytest.raises(PipelineError, match="evaluation data.*ids"):
        eval_data_from_npz(path, SIGNATURE)


def test_batches_and_head_keep_sample_order() -> None:
    data = synthetic_eval_data(SIGNATURE, 10)
    batches = list(data.batches(4))
    assert [len(b["image"]) for b in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b["ids"] for b in batches]), data.inputs["ids"])
    head = data.head(3)
    assert set(head) == {"image", "ids"} and len(head["image"]) == 3
    np.testing.assert_array_equal(head["image"], data.inputs["image"][:3])


def test_synthetic_samples_are_seeded_and_fill_dynamic_dims() -> None:
    data = synthetic_eval_data(SIGNATURE, 6, {"ids:1": 11}, seed=3)
    assert data.labels is None and data.num_samples == 6
    assert data.inputs["image"].shape == (6, 4, 4, 1) and data.inputs["image"].dtype == np.float32
    assert 0.0 <= data.inputs["image"].min() and data.inputs["image"].max() < 1.0
    assert data.inputs["ids"].shape == (6, 11) and data.inputs["ids"].dtype == np.int64
    assert set(np.unique(data.inputs["ids"])) <= {0, 1}  # any embedding table accepts 0 and 1
    again = synthetic_eval_data(SIGNATURE, 6, {"ids:1": 11}, seed=3)
    np.testing.assert_array_equal(again.inputs["image"], data.inputs["image"])
    assert again.fingerprint == data.fingerprint and "seed 3" in data.source
    other = synthetic_eval_data(SIGNATURE, 6, {"ids:1": 11}, seed=4)
    assert not np.array_equal(other.inputs["image"], data.inputs["image"]) and other.fingerprint != data.fingerprint
    # a dynamic axis without a hint gets 8
    assert synthetic_eval_data(SIGNATURE, 2).inputs["ids"].shape == (2, 8)


def test_synthetic_booleans() -> None:
    signature = ModelSignature((TensorSpec("mask", np.dtype(bool), ("batch", 3)),), ())
    mask = synthetic_eval_data(signature, 50).inputs["mask"]
    assert mask.dtype == bool and mask.shape == (50, 3) and mask.any() and not mask.all()


def test_one_label_per_sample_for_a_multilabel_output_names_the_binary_override() -> None:
    """An output of unknown width trained with a binary loss is judged as multi-label; labels of one 0/1 value per
    sample are refused with the fix for both readings: per-class labels, or --output-kind NAME=binary."""
    from pipeline.accuracy.evaldata import check_targets

    with pytest.raises(PipelineError) as refused:
        check_targets({"flags": np.array([0, 1, 1, 0])}, {"flags": ((-1,), "multilabel", None)}, "eval.npz")
    assert refused.value.fix.endswith("; or, if the output is one decision, --output-kind flags=binary")
    with pytest.raises(PipelineError) as wrong_width:  # labels of another rank for a binary output: no such hint
        check_targets({"flag": np.zeros((4, 2, 2))}, {"flag": ((1,), "binary", None)}, "eval.npz")
    assert "--output-kind" not in wrong_width.value.fix
