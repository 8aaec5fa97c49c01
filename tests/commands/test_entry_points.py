"""The entry points users call by name keep working whatever the package layout: ``python -m pipeline``, the
``keras-trt-pipeline`` script, ``python -m pipeline.models.digits`` (docs/guide/data.md) and
``python -m pipeline.stages.tf2onnx_run`` (the command every ``model.fp32.onnx.stage.json`` records to reproduce it)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np

from tests.conftest import ROOT


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_python_m_pipeline_models_digits_writes_the_shipped_data(tmp_path: Path) -> None:
    ran = _run("-m", "pipeline.models.digits", str(tmp_path / "digits"), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    shipped = ROOT / "calibration" / "digits"
    assert sorted(p.name for p in (tmp_path / "digits").iterdir()) == ["calib.npz", "eval.npz", "labels.txt"]
    assert (tmp_path / "digits" / "labels.txt").read_text() == (shipped / "labels.txt").read_text()
    for name in ("calib.npz", "eval.npz"):
        with np.load(tmp_path / "digits" / name) as made, np.load(shipped / name) as kept:
            assert sorted(made.files) == sorted(kept.files)
            for key in made.files:
                np.testing.assert_array_equal(made[key], kept[key])


def test_python_m_tf2onnx_run_the_recorded_reproduce_command_starts(tmp_path: Path) -> None:
    ran = _run("-m", "pipeline.stages.tf2onnx_run", "--help", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "--saved-model" in ran.stdout


def test_the_console_script_and_python_m_pipeline_reach_the_same_main(tmp_path: Path) -> None:
    from pipeline.cli import main

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "keras-trt-pipeline"]
    assert script.load() is main
    ran = _run("-m", "pipeline", "--help", cwd=tmp_path)
    assert ran.returncode == 0 and ran.stdout.startswith("usage: python -m pipeline"), ran.stderr
