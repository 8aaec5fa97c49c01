"""Parity judged at the reference's precision: a ``mixed_float16`` model whose 100 raw logits reach ~30 computes in
float16 in TensorFlow, so its own answer is only within float16's spacing (0.0156 between 16 and 32) of the true value;
the float32 ONNX conversion is held to that, and a wrong conversion still fails. Real TF, tf2onnx and ONNX Runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pipeline.accuracy.evaldata import EvalData
from pipeline.core.errors import CheckFailed
from pipeline.stages.parity import parity_report_from_models
from tests.conftest import cli


@pytest.fixture(scope="module")
def mixed_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mixed-logits")
    rng = np.random.default_rng(4)
    images = (rng.random((900, 1, 1, 3)) * rng.random((900, 16, 16, 3)) * 2).astype(np.float32)
    np.savez(root / "calib.npz", image=images[:300])
    np.savez(root / "eval.npz", image=images[300:])
    proc = cli("build", "--model", "tests.keras_models:mixed_logits", "--name", "mixed_logits", "--fp16", "--int8", "--calibration", str(root / "calib.npz"),
               "--eval-data", str(root / "eval.npz"), "--workdir", str(root / "w"), "--repository", str(root / "repo"),
               "--calibration-root", str(root / "calibration"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.mark.slow
def test_mixed_float16_logits_build_with_parity_at_float16s_spacing(mixed_build: Path) -> None:
    report = json.loads((mixed_build / "w" / "mixed_logits" / "parity.json").read_text())
    logits = report["outputs"]["logits"]
    assert report["tolerance"]["reference_format"] == "float16" and report["tolerance"]["ulps"] == 4.0 and report["tolerance"]["atol"] == 0.01
    assert json.loads((mixed_build / "w" / "mixed_logits" / "manifest.json").read_text())["results"]["output_kinds"][0]["kind"] == "classes"
    assert logits["beyond"] == 0 and logits["top1_agreement"] == 1.0
    # what an absolute tolerance could not hold: float16's own rounding at values this large
    assert logits["max_abs"] > 1e-3, logits["max_abs"]
    assert {p.name for p in (mixed_build / "repo").iterdir()} >= {"mixed_logits_fp32", "mixed_logits_fp16", "mixed_logits_int8"}


def _planted(src: Path, dst: Path, plant: str) -> Path:
    """``src`` with one conversion defect: the first convolution reading its input channels swapped (R↔B), the logits'
    bias dropped, or the square Dense's weight transposed."""
    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    producers = [n for n in model.graph.node]

    def weight(op: str, position: int = 1, last: bool = False) -> onnx.TensorProto:
        node = [n for n in producers if n.op_type == op and any(i in inits for i in n.input)][-1 if last else 0]
        return inits[node.input[position]]

    if plant == "channels":
        w = weight("Conv")
        array = numpy_helper.to_array(w)
        w.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array[:, ::-1]), w.name))
    elif plant == "bias":
        add = [n for n in producers if n.op_type in ("Add", "Gemm") and any(i in inits and numpy_helper.to_array(inits[i]).shape == (100,) for i in n.input)][0]
        b = inits[next(i for i in add.input if i in inits and numpy_helper.to_array(inits[i]).shape == (100,))]
        b.CopyFrom(numpy_helper.from_array(np.zeros(100, numpy_helper.to_array(b).dtype), b.name))
    else:
        square = next(i for i in model.graph.initializer if numpy_helper.to_array(i).shape == (32, 32))
        square.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(square).T), square.name))
    onnx.save(model, str(dst))
    return dst


@pytest.mark.slow
@pytest.mark.parametrize("plant", ["channels", "bias", "transposed"])
def test_a_wrong_conversion_still_fails(mixed_build: Path, tmp_path: Path, plant: str) -> None:
    workspace = mixed_build / "w" / "mixed_logits"
    wrong = _planted(workspace / "model.fp32.onnx", tmp_path / f"{plant}.onnx", plant)
    with np.load(mixed_build / "eval.npz") as arrays:
        data = EvalData.single({"image": arrays["image"][:200]}, None, "planted", plant)
    kinds = json.loads((workspace / "manifest.json").read_text())["results"]["output_kinds"]
    with pytest.raises(CheckFailed) as caught:
        parity_report_from_models(workspace / "savedmodel", wrong, data, tmp_path / "parity.json", atol=1e-4, rtol=1e-5, batch_size=50,
                                  reference_format="float16", ulps=4.0, kinds=kinds)
    line = caught.value.problem
    assert "output 'logits'" in line and "atol 0.0001 + rtol 1e-05·|TensorFlow| + 4 float16 spacings" in line, line
    assert "(TensorFlow computes in float16)" in line and "top-1 agreement" in line, line


@pytest.mark.slow
def test_a_mixed_bfloat16_model_builds_with_parity_at_bfloat16s_spacing(tmp_path: Path) -> None:
    """A mixed_bfloat16 model: its bfloat16 weights widened (its graph failed ONNX's checker with a traceback before),
    and parity held to bfloat16's spacing, the coarser format it computed in."""
    images = np.random.default_rng(5).random((500, 16, 16, 3)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", image=images[:200])
    np.savez(tmp_path / "eval.npz", image=images[200:])
    proc = cli("build", "--model", "tests.keras_models:mixed_bfloat16", "--name", "bf16", "--fp16", "--int8", "--calibration", str(tmp_path / "calib.npz"),
               "--eval-data", str(tmp_path / "eval.npz"), "--int8-max-drop", "50", "--fp16-max-drop", "50", "--workdir", str(tmp_path / "w"),
               "--repository", str(tmp_path / "repo"), "--calibration-root", str(tmp_path / "calibration"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "w" / "bf16" / "parity.json").read_text())
    assert report["tolerance"]["reference_format"] == "bfloat16" and report["outputs"]["logits"]["beyond"] == 0
    assert "the model computes in bfloat16 (mixed precision)" in proc.stderr
