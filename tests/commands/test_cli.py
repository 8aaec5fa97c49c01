"""Bad input: one line naming the problem and the fix, exit status 2, no traceback."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import cli, one_line_error


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda d: d / "missing.keras", "does not exist"),
        (lambda d: _write(d / "model.txt", b"hello"), "is not a Keras model file"),
        (lambda d: _write(d / "broken.keras", b"\x00garbage" * 10), "is not a valid .keras archive"),
        (lambda d: _zip(d / "empty.keras"), "cannot load Keras model"),
        (lambda d: d, "is not a SavedModel"),
        (lambda d: "no_such_module_xyz:make", "cannot import module 'no_such_module_xyz'"),
        (lambda d: "no_such_pkg_xyz.models:make", "cannot import module 'no_such_pkg_xyz.models'"),
        (lambda d: "tests.keras_models:not_a_model", "gave a str, not a Keras model"),
    ],
    ids=["missing", "not-keras", "corrupt", "not-a-keras-archive", "dir-not-savedmodel", "bad-module", "bad-package", "not-a-model"],
)
def test_bad_model_inputs(tmp_path: Path, make, expected: str) -> None:
    line = one_line_error(cli("build", "--model", str(make(tmp_path)), "--workdir", str(tmp_path / "w")))
    assert expected in line and " — " in line, line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--max-batch", "0"), "--max-batch 0 is out of range"),
        (("--opset", "11"), "--opset 11 is too old"),
        (("--name", "bad name!"), "not a valid Triton model name"),
        (("--parity-atol", "abc"), "'abc' is not a number"),
        (("--eval-data", "nowhere.npz"), "does not exist"),
        (("--int8", "--calibration", "nowhere/"), "calibration data 'nowhere' does not exist"),
        (("--shape", "garbage"), "malformed --shape 'garbage'"),
    ],
)
def test_bad_options(tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    line = one_line_error(cli("build", "--workdir", str(tmp_path), *args))
    assert expected in line, line


@pytest.mark.slow
def test_eval_data_with_wrong_input_name(tmp_path: Path) -> None:
    bad = tmp_path / "eval.npz"
    np.savez(bad, pixels=np.zeros((4, 8, 8, 1), np.float32))
    line = one_line_error(cli("build", "--workdir", str(tmp_path), "--eval-data", str(bad)))
    assert "evaluation data" in line and "has arrays ['pixels'] that are not model inputs" in line and "image" in line


@pytest.mark.parametrize("command", ["serve", "deploy"])
def test_port_out_of_range(command: str) -> None:
    line = one_line_error(cli(command, "--http-port", "99999"))
    assert "port 99999 is out of range" in line


def test_help_teaches() -> None:
    proc = cli("build", "--help")
    assert proc.returncode == 0
    for flag in ("--model", "--name", "--workdir", "--repository", "--opset", "--max-batch", "examples:"):
        assert flag in proc.stdout


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("readme.txt", "not a model")
    return path
