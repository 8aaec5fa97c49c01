"""Evaluation and calibration files that cannot crash a command: every kind of damage to the .npz a user hands over
gets one 'error:' line naming the file and the fix, exit 2, no traceback, in ``build`` (--eval-data, --calibration),
``verify --eval-data`` and ``loadtest --data``; the repository the shared build published stays as it was."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, Built, cli, one_line_error

pytestmark = pytest.mark.slow

GOOD = ROOT / "calibration" / "digits" / "eval.npz"


def _good() -> dict[str, np.ndarray]:
    with np.load(GOOD) as npz:
        return {k: npz[k] for k in npz.files}


def _raw(path: Path, data: bytes) -> None:
    path.write_bytes(data)


DAMAGE: dict[str, Callable[[Path], None]] = {
    "empty": lambda p: _raw(p, b""),
    "truncated": lambda p: _raw(p, GOOD.read_bytes()[: GOOD.stat().st_size // 2]),
    "text": lambda p: _raw(p, b"image,labels\n0.1,3\n"),
    "strings": lambda p: np.savez(p, image=np.full(_good()["image"].shape, "x"), labels=_good()["labels"]),
    "objects": lambda p: np.savez(p, image=np.array([np.zeros(3), np.zeros(5)], dtype=object), labels=np.zeros(2, np.int64)),
    "rank": lambda p: np.savez(p, image=_good()["image"][..., 0], labels=_good()["labels"]),
    "width": lambda p: np.savez(p, image=_good()["image"][:, :5], labels=_good()["labels"]),
    "no samples": lambda p: np.savez(p, image=_good()["image"][:0], labels=_good()["labels"][:0]),
    "wrong name": lambda p: np.savez(p, pixels=_good()["image"], labels=_good()["labels"]),
    "labels short": lambda p: np.savez(p, image=_good()["image"], labels=_good()["labels"][:7]),
    "nan": lambda p: np.savez(p, image=np.where(_good()["image"] > 0.5, np.nan, _good()["image"]).astype(np.float32), labels=_good()["labels"]),
}
# loadtest sends inputs and ignores labels: a file whose only damage is its labels is a good load-test file.
LABELS_ONLY = ("labels short",)


@pytest.fixture(scope="module")
def own_build(built: Built, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("damaged")
    shutil.copytree(built.workdir, root / "build", symlinks=True)
    shutil.copytree(built.repository, root / "model_repository", symlinks=True)
    return root / "build", root / "model_repository"


def _unchanged(repository: Path) -> list[str]:
    return sorted(str(p.relative_to(repository)) for p in repository.rglob("*"))


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_build_refuses_a_damaged_file_in_one_line(damage: str, own_build: tuple[Path, Path], tmp_path: Path) -> None:
    workdir, repository = own_build
    before = _unchanged(repository)
    bad = tmp_path / f"{damage.replace(' ', '_')}.npz"
    DAMAGE[damage](bad)
    for flag in ("--eval-data", "--calibration"):
        if flag == "--calibration" and damage == "labels short":
            continue  # calibration files have no labels
        line = one_line_error(cli("build", "--int8", "--workdir", str(workdir), "--repository", str(repository), flag, str(bad)))
        assert bad.name in line, (flag, line)
    assert _unchanged(repository) == before


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_verify_and_loadtest_refuse_a_damaged_file_in_one_line(damage: str, own_build: tuple[Path, Path], tmp_path: Path) -> None:
    workdir, repository = own_build
    bad = tmp_path / f"{damage.replace(' ', '_')}.npz"
    DAMAGE[damage](bad)
    verify = cli("verify", "--workdir", str(tmp_path / "v"), "--repository", str(repository), "--model", "digits_fp32", "--eval-data", str(bad))
    assert bad.name in one_line_error(verify)
    if damage in LABELS_ONLY:
        return
    loadtest = cli("loadtest", "--workdir", str(tmp_path / "l"), "--repository", str(repository), "--model", "digits_fp32", "--data", str(bad),
                   "--concurrency", "1", "--max-seconds", "6")
    line = one_line_error(loadtest)
    assert bad.name in line or damage in ("wrong name", "no samples", "width", "rank"), line  # these name the model and the input instead
