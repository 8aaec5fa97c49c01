"""The bundled model's data: deterministic splits, and the committed files are exactly what the code makes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.models import digits
from tests.conftest import ROOT


def test_committed_data_is_what_write_data_makes(tmp_path: Path) -> None:
    digits.write_data(tmp_path)
    for name in ("eval.npz", "calib.npz"):
        with np.load(ROOT / "calibration" / "digits" / name, allow_pickle=False) as committed, np.load(tmp_path / name) as fresh:
            assert committed.files == fresh.files
            for key in committed.files:
                np.testing.assert_array_equal(committed[key], fresh[key])
    assert (tmp_path / "labels.txt").read_text() == (ROOT / "calibration" / "digits" / "labels.txt").read_text()


def test_splits_are_disjoint_and_sized() -> None:
    parts = digits.splits()
    eval_x, eval_y = parts["eval"]
    calib_x, _ = parts["calib"]
    train_x, _ = parts["train"]
    assert len(calib_x) >= 500 and len(eval_x) == 449 and len(train_x) + len(eval_x) == 1797
    assert eval_x.dtype == np.float32 and eval_x.shape[1:] == (8, 8, 1) and 0 <= eval_x.min() and eval_x.max() <= 1
    train_rows = {row.tobytes() for row in train_x}
    # calibration comes from the training split; evaluation is held out from it
    assert all(row.tobytes() in train_rows for row in calib_x)
    assert np.bincount(eval_y, minlength=10).min() > 20
