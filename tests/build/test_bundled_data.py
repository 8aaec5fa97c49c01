"""Where the bundled model's generated data goes: under the workdir when the build runs outside the
source tree (never into the current directory), the source tree's calibration/ when it runs there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli

DECIDE = ("import sys; from pathlib import Path; from pipeline.core.options import CALIBRATION_ROOT; "
          "from pipeline.data.workspace import bundled_model_data; "
          "print(bundled_model_data(Path(sys.argv[1]), CALIBRATION_ROOT, Path(sys.argv[2]), 'digits').folder.resolve())")


def decide(cwd: Path, root: str, workdir: str) -> Path:
    """The decision, made from ``cwd`` (a child process: the current directory is the input)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", DECIDE, root, workdir], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return Path(proc.stdout.strip())


def test_outside_the_source_tree_the_data_goes_under_the_workdir(tmp_path: Path) -> None:
    assert decide(tmp_path, "calibration", "w") == (tmp_path / "w" / "calibration" / "digits").resolve()
    assert decide(tmp_path, "mine", "w") == (tmp_path / "mine" / "digits").resolve()  # --calibration-root given: there


def test_existing_data_under_the_default_root_is_used_where_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "calibration" / "digits"
    folder.mkdir(parents=True)
    for name in ("eval.npz", "calib.npz", "labels.txt"):
        (folder / name).write_text("")
    assert decide(tmp_path, "calibration", "w") == folder.resolve()


def test_in_the_source_tree_it_is_the_trees_calibration_folder() -> None:
    assert decide(ROOT, "calibration", "build") == (ROOT / "calibration" / "digits").resolve()


@pytest.mark.slow
def test_build_from_another_directory_writes_nothing_into_it(tmp_path: Path) -> None:
    cwd, workdir = tmp_path / "elsewhere", tmp_path / "w"
    cwd.mkdir()
    proc = cli("build", "--no-engine", "--workdir", str(workdir), "--repository", str(tmp_path / "repo"), cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert list(cwd.iterdir()) == []
    data = workdir / "calibration" / "digits"
    assert sorted(p.name for p in data.iterdir()) == ["calib.npz", "eval.npz", "labels.txt"]
    report = json.loads((tmp_path / "repo" / "digits_fp32" / ".pipeline-report.json").read_text())
    assert str(data) in json.dumps(report)  # later commands find the data through the build record
