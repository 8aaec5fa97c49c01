"""End to end: real Keras models through SavedModel, tf2onnx and the parity gate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from pipeline.build.config import BuildConfig, Gates
from pipeline.build.orchestrator import build
from pipeline.core.errors import PipelineError
from pipeline.data.tensors import signature_from_onnx
from tests.conftest import ROOT, cli, one_line_error

pytestmark = pytest.mark.slow


def _build(tmp_path: Path, model: str, **kw) -> "object":
    return build(BuildConfig(model=model, workdir=tmp_path / "build", calibration_root=tmp_path / "calibration", repository=tmp_path / "repo", **kw))


def test_default_model_end_to_end_and_noop_rebuild(tmp_path: Path) -> None:
    args = ("build", "--workdir", str(tmp_path / "build"), "--repository", str(tmp_path / "repo"))
    first = cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    ws = tmp_path / "build" / "digits"
    sig = signature_from_onnx(ws / "model.fp32.onnx")
    assert [s.name for s in sig.inputs] == ["image"] and [s.name for s in sig.outputs] == ["probs"]
    assert sig.inputs[0].shape == ("batch", 8, 8, 1)
    parity = json.loads((ws / "parity.json").read_text())
    assert parity["passed"] and parity["samples"] == 449 and parity["outputs"]["probs"]["max_abs"] < 1e-4

    with np.load(ROOT / "calibration" / "digits" / "eval.npz") as data:
        probs = ort.InferenceSession(str(ws / "model.fp32.onnx")).run(None, {"image": data["image"]})[0]
        assert (probs.argmax(1) == data["labels"]).mean() >= 0.95

    manifest = json.loads((ws / "manifest.json").read_text())
    assert {s["name"]: s["status"] for s in manifest["stages"]}["onnx"] == "ran"
    assert manifest["versions"]["tf2onnx"].startswith("1.17")
    sidecar = json.loads((ws / "model.fp32.onnx.stage.json").read_text())
    assert "-m pipeline.stages.tf2onnx_run --saved-model" in sidecar["reproduce"]

    versions = sorted(p.name for p in (tmp_path / "repo" / "digits_fp32").iterdir() if p.name.isdigit())
    # the same build, options reordered and logging louder: nothing is redone, no new version
    again = cli("-v", "build", "--repository", str(tmp_path / "repo"), "--workdir", str(tmp_path / "build"))
    assert again.returncode == 0, again.stderr[-3000:]
    statuses = {s["name"]: s["status"] for s in json.loads((ws / "manifest.json").read_text())["stages"]}
    assert set(statuses.values()) <= {"skipped", "not run"} and statuses["onnx"] == "skipped", statuses
    assert statuses["publish"] == "skipped"
    assert sorted(p.name for p in (tmp_path / "repo" / "digits_fp32").iterdir() if p.name.isdigit()) == versions == ["1"]
    assert "skipped" in again.stdout + again.stderr


def test_changed_setting_reruns_only_affected_stages(tmp_path: Path) -> None:
    _build(tmp_path, "tests.keras_models:sequential")
    result = _build(tmp_path, "tests.keras_models:sequential", gates=Gates(parity_atol=1e-3))
    statuses = {s["name"]: s["status"] for s in json.loads(result.manifest.read_text())["stages"]}
    assert statuses["savedmodel"] == "skipped" and statuses["onnx"] == "skipped" and statuses["parity"] == "ran"


def test_keras_file_multi_input_multi_output(tmp_path: Path) -> None:
    from tests.keras_models import multi_io

    path = tmp_path / "twohead.keras"
    multi_io().save(path)
    result = _build(tmp_path, str(path))
    sig = signature_from_onnx(result.workspace.onnx("fp32"))
    assert sorted(s.name for s in sig.inputs) == ["image", "meta"]
    assert sorted(s.name for s in sig.outputs) == ["cls", "reg"]
    assert all(s.shape[0] == "batch" for s in sig.inputs + sig.outputs)
    report = json.loads(result.workspace.parity.read_text())
    assert set(report["outputs"]) == {"cls", "reg"} and report["passed"]


def test_savedmodel_input(tmp_path: Path) -> None:
    from pipeline.stages.savedmodel import savedmodel_from_keras
    from tests.keras_models import sequential

    saved = savedmodel_from_keras(sequential(), tmp_path / "seq_saved")
    result = _build(tmp_path, str(saved))
    assert result.name == "seq_saved"
    stages = {s["name"]: s["status"] for s in json.loads(result.manifest.read_text())["stages"]}
    assert stages["savedmodel"] == "not run" and stages["parity"] == "ran"
    sig = signature_from_onnx(result.workspace.onnx("fp32"))
    assert [s.name for s in sig.inputs] == ["features"]


def test_integer_input_with_dynamic_sequence_axis(tmp_path: Path) -> None:
    result = _build(tmp_path, "tests.keras_models:tokens")
    onnx_path = result.workspace.onnx("fp32")
    sig = signature_from_onnx(onnx_path)
    assert sig.inputs[0].dtype == np.int32 and sig.inputs[0].shape == ("batch", "tokens_dim1")
    session = ort.InferenceSession(str(onnx_path))
    for length in (3, 17):
        ids = np.random.default_rng(0).integers(0, 100, (2, length)).astype(np.int32)
        probs = session.run(None, {"tokens": ids})[0]
        assert probs.shape == (2, 4) and np.allclose(probs.sum(1), 1, atol=1e-5)


def test_parity_gate_fails_on_a_different_model(tmp_path: Path) -> None:
    """The gate compares TF and ONNX for real: an ONNX model of other weights must fail it."""
    import keras

    from pipeline.accuracy.evaldata import synthetic_eval_data
    from pipeline.stages.parity import parity_report_from_models
    from pipeline.stages.savedmodel import savedmodel_from_keras
    from tests.keras_models import sequential

    keras_file = tmp_path / "seq.keras"
    sequential().save(keras_file)
    good = _build(tmp_path, str(keras_file))
    other = keras.models.load_model(keras_file)  # same layer (output) names, other weights
    other.set_weights([w + 0.05 for w in other.get_weights()])
    other_saved = savedmodel_from_keras(other, tmp_path / "other_saved")
    onnx_path = good.workspace.onnx("fp32")
    data = synthetic_eval_data(signature_from_onnx(onnx_path), 64)
    with pytest.raises(PipelineError, match=r"ONNX model differs from TensorFlow: output '\w+' has \d+ of \d+ values farther than atol"):
        parity_report_from_models(other_saved, onnx_path, data, tmp_path / "parity.json", atol=1e-4, rtol=0, batch_size=16)
    assert json.loads((tmp_path / "parity.json").read_text())["passed"] is False


def test_parity_gate_failure_through_cli(tmp_path: Path) -> None:
    proc = cli("build", "--model", "tests.keras_models:sequential", "--workdir", str(tmp_path), "--parity-atol", "0", "--parity-rtol", "0")
    line = one_line_error(proc, status=1)  # the parity check ran and failed
    assert "differs from TensorFlow" in line and "--parity-atol" in line


def test_unsupported_op_is_one_clear_line(tmp_path: Path) -> None:
    line = one_line_error(cli("build", "--model", "tests.keras_models:unsupported_op", "--workdir", str(tmp_path)))
    assert "cannot convert TensorFlow op(s) Igamma" in line
    assert not list(tmp_path.rglob("*.onnx"))
