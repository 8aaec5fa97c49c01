"""The Keras Applications backbones of the zoo (ResNet50, MobileNetV3Small, DenseNet121) through TensorRT's
real parser and builder, in CI.

Their full build-serve-verify run (tests/zoo/test_zoo.py) is ``--heavy`` only: 5-10 minutes each on 2
cores. The TensorRT check needs only their graphs, so this test makes them with the build's own
stage functions (SavedModel → ONNX → FP16 and INT8 Q/DQ, calibrated on the zoo's data) and builds
each with TensorRT-RTX (:func:`pipeline.stages.trt_check.trt_check_from_onnx`), ahead of time for
compute capability 8.0, with the profile the build would use. The accuracy gates and serving are
test_zoo's; this proves only that TensorRT parses and builds every GPU graph of the three.

Slow (about a minute per model; TensorRT-RTX's part is 3-8 s of it). Needs the ``trt-check`` extra:
it skips without it on a developer's machine and fails in CI (tests/trt_standin.py).
"""

from __future__ import annotations

from pathlib import Path

import keras
import pytest

from pipeline.data.tensors import signature_from_onnx
from pipeline.stages.calibration import calibration_from_path
from pipeline.stages.engine import EngineSettings
from pipeline.stages.fp16 import fp16_onnx_from_onnx
from pipeline.stages.int8 import qdq_onnx_from_onnx
from pipeline.stages.onnx_export import onnx_from_savedmodel
from pipeline.stages.savedmodel import savedmodel_from_keras
from pipeline.stages.shapes import profiles_from_args
from pipeline.stages.trt_check import trt_check_from_onnx
from tests.trt_standin import real_builder
from tests.zoo.models import ZOO, write_data

BACKBONES = ("resnet50", "mobilenet_v3_small", "densenet121")
OPSET, MAX_BATCH, COMPUTE_CAPABILITY = 17, 64, "8.0"


@pytest.mark.slow
@pytest.mark.parametrize("name", BACKBONES)
def test_every_gpu_graph_of_a_keras_applications_backbone_builds_with_tensorrt(name: str, tmp_path: Path) -> None:
    real_builder()
    entry = ZOO[name]
    write_data(entry, tmp_path / "data")
    saved = savedmodel_from_keras(entry.make(), tmp_path / "saved")
    keras.backend.clear_session()
    fp32 = onnx_from_savedmodel(saved, tmp_path / "fp32.onnx", OPSET)
    signature = signature_from_onnx(fp32)
    fp16 = fp16_onnx_from_onnx(fp32, tmp_path / "fp16.onnx")
    calibration = calibration_from_path(tmp_path / "data", signature)
    int8 = qdq_onnx_from_onnx(fp32, tmp_path / "int8.onnx", calibration)
    [profile] = profiles_from_args([], signature, max_batch=MAX_BATCH, quiet=True)
    engines = tuple(EngineSettings(precision, (profile,)) for precision in ("fp32", "fp16", "int8"))

    report = trt_check_from_onnx([fp32, fp16, int8], tmp_path / "trt_check.json", engines=engines, compute_capability=COMPUTE_CAPABILITY)

    summary = {p: {k: v for k, v in e.items() if k != "onnx"} for p, e in report["variants"].items()}
    assert report["checker"].startswith("TensorRT-RTX 1.") and report["compute_capability"] == COMPUTE_CAPABILITY, summary
    assert {p: (e["built"], e["errors"]) for p, e in report["variants"].items()} == {p: (True, []) for p in ("fp32", "fp16", "int8")}, summary
    layers = {p: e["layers"] for p, e in report["variants"].items()}
    # a real network each, and the Q/DQ graph more layers than the float one (TensorRT's Q and DQ layers)
    assert min(layers.values()) > 100 and layers["int8"] > layers["fp32"], summary
    assert all(e["plan_bytes"] > 0 for e in report["variants"].values()), summary
