"""Builds of models whose outputs are not one softmax head: each output judged by its kind, end to end
(real TensorFlow, tf2onnx, ONNX Runtime and, for the two-head model, the embedded Triton server)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.data.tensors import signature_from_onnx
from tests.conftest import ROOT, cli, one_line_error

pytestmark = pytest.mark.slow


def _args(tmp_path: Path, model: str, *extra: str) -> list[str]:
    name = model.rpartition(":")[2] if ":" in model else Path(model).stem
    return ["build", "--model", model, "--name", name, "--workdir", str(tmp_path / "w"), "--repository", str(tmp_path / "repo"),
            "--calibration-root", str(tmp_path / "calibration"), *extra]


def test_two_heads_are_each_judged_and_verified_in_keras_order(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, **{"labels:class_probs": rng.integers(0, 4, 600), "labels:box": rng.normal(size=(600, 4))})
    proc = cli(*_args(tmp_path, "tests.keras_models:two_heads", "--fp16", "--eval-data", str(tmp_path / "eval.npz"), "--verify-served"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'class_probs': classes — trained with sparse_categorical_crossentropy; 'box': regression — trained with mse" in proc.stderr
    ws = tmp_path / "w" / "two_heads"
    assert [o.name for o in signature_from_onnx(ws / "model.fp32.onnx").outputs] == ["class_probs", "box"]  # Keras order, not tf2onnx's
    rows = {(r["output"], r["metric"]): r for r in json.loads((ws / "accuracy.json").read_text())["variants"][0]["gates"]}
    assert rows[("class_probs", "accuracy drop (top-1)")]["verdict"] == "pass"
    assert rows[("box", "R² drop")]["verdict"] == "pass" and ("box", "max abs error") not in rows  # regression: judged relative to its spread
    served = json.loads((ws / "manifest.json").read_text())["results"]["served"]["models"]
    assert {m["model"]: sorted(m["outputs"]) for m in served} == {"two_heads_fp16": ["box", "class_probs"], "two_heads_fp32": ["box", "class_probs"]}
    fp16 = next(m for m in served if m["model"] == "two_heads_fp16")
    assert {r["output"] for r in fp16["gates"]} == {"box", "class_probs"} and fp16["passed"]


def test_regression_int8_on_the_wrong_scale_fails_and_the_right_scale_passes(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1100, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x[:600])
    np.savez(tmp_path / "calib_bad.npz", x=x[600:] / 100)  # a preprocessing mistake: activations' ranges 100× too small
    np.savez(tmp_path / "calib.npz", x=x[600:])
    bad = cli(*_args(tmp_path, "tests.keras_models:regression", "--int8", "--eval-data", str(tmp_path / "eval.npz"),
                     "--calibration", str(tmp_path / "calib_bad.npz")))
    line = one_line_error(bad, status=1)
    assert "accuracy gate failed: int8-onnx: output 'value' (regression): RMS change / FP32 std" in line
    assert not (tmp_path / "repo" / "regression_int8").exists()
    good = cli(*_args(tmp_path, "tests.keras_models:regression", "--int8", "--eval-data", str(tmp_path / "eval.npz"),
                      "--calibration", str(tmp_path / "calib.npz")))
    assert good.returncode == 0, good.stderr[-3000:]
    assert (tmp_path / "repo" / "regression_int8").is_dir()


def test_labels_the_model_cannot_produce_stop_the_build_before_conversion(tmp_path: Path) -> None:
    np.savez(tmp_path / "eval.npz", features=np.zeros((20, 5), np.float32), labels=np.full(20, 12))
    proc = cli(*_args(tmp_path, "tests.keras_models:sequential", "--eval-data", str(tmp_path / "eval.npz")))
    line = one_line_error(proc)
    assert "labels of output" in line and "(classes)" in line and "run from 12 to 12, but the output has 2 classes" in line
    assert not (tmp_path / "w" / "sequential" / "model.fp32.onnx").exists()  # refused after the export, before tf2onnx


def test_mixed_precision_and_custom_layer_models_build(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    images = rng.random((800, 8, 8, 3), dtype=np.float32)
    np.savez(tmp_path / "calib.npz", image=images[:200])
    np.savez(tmp_path / "eval.npz", image=images[200:])
    # An untrained model's near-tie probabilities: what is checked here is that it builds, not how close INT8 stays.
    proc = cli(*_args(tmp_path, "tests.keras_models:mixed_precision", "--fp16", "--int8", "--calibration", str(tmp_path / "calib.npz"),
                      "--eval-data", str(tmp_path / "eval.npz"), "--int8-max-drop", "50", "--fp16-max-drop", "50"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the model computes in float16 (mixed precision)" in proc.stderr
    assert {p.name for p in (tmp_path / "repo").iterdir()} >= {"mixed_precision_fp32", "mixed_precision_fp16", "mixed_precision_int8"}

    import onnx

    int8 = onnx.load(str(tmp_path / "w" / "mixed_precision" / "model.int8.onnx"))
    scales = [i for i in int8.graph.initializer if i.name.endswith("_scale") and list(i.dims) == [8]]
    assert scales, "the conv weights are quantized per channel through the float16 casts"

    from tests.custom_layers import model

    model().save(tmp_path / "custom.keras")
    missing = one_line_error(cli(*_args(tmp_path, str(tmp_path / "custom.keras"))))
    assert "Could not locate class 'ScaledSwish'" in missing and "--import MODULE" in missing
    built = cli(*_args(tmp_path, str(tmp_path / "custom.keras"), "--import", "tests.custom_layers"), cwd=ROOT)
    assert built.returncode == 0, built.stderr[-3000:]
