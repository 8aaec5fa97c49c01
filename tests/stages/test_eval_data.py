"""The evaluation data of a build (pipeline.stages.eval_data): labeled data when given, else calibration
samples held out of calibration (never judged on what INT8 calibrated on), else synthetic samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.data.tensors import ModelSignature, TensorSpec
from pipeline.stages.calibration import MIN_SAMPLES, calibration_from_path, proportional_shares
from pipeline.stages.eval_data import HOLDOUT_MIN, SYNTHETIC_SAMPLES, eval_data_for

SEQ = ModelSignature(inputs=(TensorSpec("tokens", np.dtype(np.int64), ("batch", "seq")),), outputs=(TensorSpec("y", np.dtype(np.float32), ("batch", 2)),))
COUNTS = {8: 221, 12: 221, 16: 221, 20: 1}  # three large length buckets and a single sample of a fourth length


def bucketed(tmp_path: Path, counts: dict[int, int]) -> Path:
    """One .npz of length buckets (``len08`` … ``len20``, read in that order, the single sample last); every token
    is its sample's unique id, so samples can be told apart."""
    arrays, ids = {}, 0
    for length, n in counts.items():
        arrays[f"tokens__len{length:02d}"] = np.repeat(np.arange(ids, ids + n)[:, None], length, axis=1)
        ids += n
    np.savez(tmp_path / "calib.npz", **arrays)
    return tmp_path / "calib.npz"


def ids(batches: object) -> list[int]:
    return sorted(int(i) for b in batches for i in b["tokens"][:, 0])  # type: ignore[attr-defined]


def test_shares_are_proportional_and_never_more_than_a_bucket_holds() -> None:
    assert proportional_shares([221, 221, 221, 1], 332) == [111, 111, 110, 0]  # 110.5 each and 0.5: the remainders go to the first
    assert proportional_shares([221, 221, 221, 1], 664) == [221, 221, 221, 1]
    assert proportional_shares([10, 0, 5], 3) == [2, 0, 1]
    for counts, total in (([221, 221, 221, 1], 333), ([1, 1, 1, 997], 500), ([7, 3], 1)):
        shares = proportional_shares(counts, total)
        assert sum(shares) == total and all(0 <= s <= c for s, c in zip(shares, counts)), (counts, total, shares)
    with pytest.raises(PipelineError):
        proportional_shares([3, 4], 8)


def test_holding_out_half_of_uneven_buckets_keeps_every_bucket_whole(tmp_path: Path) -> None:
    """332 of [221, 221, 221, 1]: rounding each bucket's share left −1 samples in the last bucket."""
    calib = calibration_from_path(bucketed(tmp_path, COUNTS), SEQ, min_samples=1)
    rest, held = calib.holdout(332)
    assert rest is not None and rest.num_samples == 332 and sum(g.count for g in rest.groups) == 332
    assert all(g.count > 0 for g in rest.groups)
    held_ids = sorted(int(i) for _, arrays in held for i in arrays["tokens"][:, 0])
    assert len(held_ids) == 332 and set(held_ids).isdisjoint(ids(rest.batches(64)))
    assert set(held_ids) | set(ids(rest.batches(64))) == set(range(664))


def test_without_labels_int8_is_judged_on_samples_it_was_not_calibrated_on(tmp_path: Path) -> None:
    path = bucketed(tmp_path, COUNTS)
    calib = calibration_from_path(path, SEQ, min_samples=1)
    data, rest = eval_data_for(None, path, tmp_path / "missing" / "eval.npz", SEQ, calib)
    assert rest is not None and data.num_samples == 332 == rest.num_samples  # half, at least HOLDOUT_MIN, MIN_SAMPLES left
    assert data.labels is None and not data.synthetic and "332 of 664 samples held out of calibration, unlabeled" in data.source
    held = sorted(int(i) for b in data.batches(64) for i in b["tokens"][:, 0])
    assert set(held).isdisjoint(ids(rest.batches(64))) and len(held) == 332
    assert {b.name: b.num_samples for b in data.buckets} == {"len08": 111, "len12": 111, "len16": 110}  # the one-sample bucket stays to calibrate on


def test_a_small_calibration_set_keeps_min_samples_to_calibrate_on(tmp_path: Path) -> None:
    path = bucketed(tmp_path, {8: 250})
    calib = calibration_from_path(path, SEQ, min_samples=1)
    data, rest = eval_data_for(None, path, tmp_path / "eval.npz", SEQ, calib)
    assert rest is not None and rest.num_samples == MIN_SAMPLES and data.num_samples == 250 - MIN_SAMPLES < HOLDOUT_MIN
    tiny = calibration_from_path(bucketed(tmp_path, {8: MIN_SAMPLES}), SEQ, min_samples=1)
    data, rest = eval_data_for(None, tmp_path / "calib.npz", tmp_path / "eval.npz", SEQ, tiny)
    assert rest is tiny and data.synthetic and data.num_samples == SYNTHETIC_SAMPLES  # nothing to spare: synthetic, all calibrated on


def test_without_int8_every_calibration_sample_is_the_comparison_set(tmp_path: Path) -> None:
    path = bucketed(tmp_path, COUNTS)
    data, rest = eval_data_for(None, path, tmp_path / "eval.npz", SEQ, None)
    assert rest is None and data.num_samples == 664 and "calibration data, unlabeled" in data.source


def test_labeled_data_wins_and_a_missing_given_file_is_one_error(tmp_path: Path) -> None:
    np.savez(tmp_path / "eval.npz", tokens=np.zeros((5, 8), np.int64), labels=np.zeros(5, np.int64))
    data, rest = eval_data_for(None, bucketed(tmp_path, COUNTS), tmp_path / "eval.npz", SEQ, None)
    assert rest is None and data.num_samples == 5 and data.labels is not None
    with pytest.raises(PipelineError, match="evaluation data '.*nope.npz' does not exist"):
        eval_data_for(tmp_path / "nope.npz", tmp_path, tmp_path / "eval.npz", SEQ, None)
    data, _ = eval_data_for(None, tmp_path / "no-calibration", tmp_path / "none.npz", SEQ, None)
    assert data.synthetic and data.num_samples == SYNTHETIC_SAMPLES
