"""The large-model conversion path of pipeline/stages/tf2onnx_run.py, taken by a small model (its thresholds lowered
on the command line): the large variables go straight to the data file as initializers, tf2onnx converts the rest,
and the ONNX model answers as the ordinary conversion's does. Real TensorFlow, tf2onnx and ONNX Runtime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from pipeline.core.onnx_files import data_files
from pipeline.data.tensors import SIGNATURE
from tests.big_models import SMALL_DIM, SMALL_ROWS, sample_ids
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def _convert(saved: Path, dst: Path, *extra: str) -> None:
    command = [sys.executable, "-m", "pipeline.stages.tf2onnx_run", "--saved-model", str(saved), "--signature_def", SIGNATURE, "--opset", "17",
               "--output", str(dst), *extra]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                                                                 "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_large_variables_skip_tf2onnx_and_the_model_answers_the_same(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    code = ("from pathlib import Path; from tests.big_models import recommender_small; "
            f"from pipeline.stages.savedmodel import savedmodel_from_keras; savedmodel_from_keras(recommender_small(), Path({str(saved)!r}))")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"})
    _convert(saved, tmp_path / "plain.onnx")
    _convert(saved, tmp_path / "large.onnx", "--large-over", "0", "--spill-over", "100000")  # the 512 KB table is "large"
    _convert(saved, tmp_path / "spilled.onnx", "--spill-over", "100000")  # grappler's path, the table kept out of it: one file again
    assert data_files(tmp_path / "plain.onnx") == [] and data_files(tmp_path / "large.onnx") == [tmp_path / "large.onnx.data"]
    assert data_files(tmp_path / "spilled.onnx") == [] and not (tmp_path / "spilled.onnx.data").exists()
    graph = onnx.load(str(tmp_path / "large.onnx"), load_external_data=False).graph
    table = next(t for t in graph.initializer if t.name == "items/embeddings")  # named after the variable, not its placeholder
    assert list(table.dims) == [SMALL_ROWS, SMALL_DIM] and table.data_location == onnx.TensorProto.EXTERNAL
    assert [i.name for i in graph.input] == ["item_ids"]  # the table is no input any more
    onnx.checker.check_model(str(tmp_path / "large.onnx"), full_check=True)
    ids = sample_ids(np.random.default_rng(0), 64, SMALL_ROWS)
    plain, large, spilled = (ort.InferenceSession(str(tmp_path / f"{n}.onnx"), providers=["CPUExecutionProvider"])
                             for n in ("plain", "large", "spilled"))
    np.testing.assert_array_equal(large.run(None, {"item_ids": ids})[0], plain.run(None, {"item_ids": ids})[0])
    np.testing.assert_array_equal(spilled.run(None, {"item_ids": ids})[0], plain.run(None, {"item_ids": ids})[0])
