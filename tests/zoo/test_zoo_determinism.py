"""Two builds of one zoo model, in two workdirs from the same data, give byte-identical ``accuracy.json`` and fallback
records (the ONNX files differ only in the workdir path tf2onnx records): TensorFlow's training inside the model function is seeded and deterministic in the export's child
process, and calibration, quantization, the fallback and the gates have no other source of variation. Slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import cli
from tests.zoo.models import ZOO, write_data

pytestmark = pytest.mark.slow


def test_two_builds_of_a_zoo_model_give_identical_accuracy_files(tmp_path: Path) -> None:
    entry = ZOO["two_heads"]
    write_data(entry, tmp_path / "calibration" / entry.name)
    for run in ("a", "b"):
        proc = cli("build", "--model", entry.source, "--name", entry.name, "--fp16", "--int8", "--workdir", str(tmp_path / run),
                   "--repository", str(tmp_path / f"repo-{run}"), "--calibration-root", str(tmp_path / "calibration"), *entry.build_args)
        assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = (tmp_path / run / entry.name for run in ("a", "b"))
    assert (first / "accuracy.json").read_bytes() == (second / "accuracy.json").read_bytes()
    for name in ("int8.fallback.json", "int8cpu.fallback.json"):  # the same choices of nodes kept float (if any)
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
