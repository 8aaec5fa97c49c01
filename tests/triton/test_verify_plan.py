"""``verify`` before and after the server: which models of a repository it verifies and on what data, by which
limits and tolerances, how it judges what came back from a model file, and the report and verdict it writes.

Real repositories laid out on tmp_path (config.pbtxt, version folders, the build report beside each model), real
ONNX files made with onnx.helper, real ONNX Runtime. The server part itself (``served_outputs``) needs a running
Triton: tests/triton/test_verify.py covers it end to end (slow). TensorRT cannot exist here: the TensorRT "at hand"
is the stand-in of tests/trt_standin.py where a plan must be refused.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.errors import CheckFailed, PipelineError
from pipeline.evaldata import EvalData
from pipeline.gates import Gates
from pipeline.outputkinds import OutputKind
from pipeline.stages.tensorrt_env import GpuInfo
from pipeline.stages.trt_seam import PolygraphyTensorRT
from pipeline.triton.repository import read_repository
from pipeline.triton.served_gate import ServedResult
from pipeline.triton.verify import (_check_plans_at_hand, _plan, _planned, _recorded_gates, _servable_models, _served_atol, _verdict,
                                    _verification_plan, served_against_file)
from tests.trt_standin import StandInTensorRT

PROBS = OutputKind("probs", "classes", "recorded by its build", classes=3)
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", (8, 0))


def softmax_onnx(path: Path, weights: np.ndarray) -> Path:
    """x [batch, 4] → softmax(x @ weights): 'probs' [batch, 3], a class-score output."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)],
        "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(weights.astype(np.float32), "w")],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def add_model(repository: Path, name: str, *, platform: str = 'platform: "onnxruntime_onnx"', max_batch: int = 8, versions: tuple[int, ...] = (1,),
              build: dict[str, Any] | None = None, filename: str = "model.onnx", rng: np.random.Generator | None = None) -> Path:
    """One model folder as publish writes it: config.pbtxt, numeric versions, and the build report when ``build`` is given."""
    model = repository / name
    model.mkdir(parents=True)
    extra = f'default_model_filename: "{filename}"\n' if filename != "model.onnx" else ""
    (model / "config.pbtxt").write_text(f'name: "{name}"\n{platform}\nmax_batch_size: {max_batch}\n{extra}')
    for version in versions:
        softmax_onnx(model / str(version) / filename, (rng or np.random.default_rng(version)).normal(size=(4, 3)))
    if build is not None:
        (model / ".pipeline-report.json").write_text(json.dumps({"model": name, "versions": {str(v): {"build": build} for v in versions}}))
    return model


def eval_npz(path: Path, rng: np.random.Generator, n: int = 10, labels: dict[str, np.ndarray] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {"x": rng.normal(size=(n, 4)).astype(np.float32), "labels": rng.integers(0, 3, n)} if labels is None else {
        "x": rng.normal(size=(n, 4)).astype(np.float32), **labels}
    np.savez(path, **arrays)
    return path


# --- which models, and why not the others -----------------------------------------------------------------------


def mixed_repository(tmp_path: Path) -> Path:
    repository = tmp_path / "repo"
    add_model(repository, "m_fp32")
    add_model(repository, "m_fp16")
    add_model(repository, "m_u8")
    add_model(repository, "m_fp16_trt", platform='platform: "tensorrt_plan"')
    add_model(repository, "m_int8_trt", platform='backend: "tensorrt"')
    add_model(repository, "theirs")
    add_model(repository, "m_py", platform='backend: "python"')
    return repository


def test_only_the_pipelines_float_input_onnx_variants_are_verified_and_every_other_model_says_why(tmp_path: Path) -> None:
    repository = mixed_repository(tmp_path)
    chosen, not_verified, plans = _servable_models(repository, [])
    assert sorted(chosen) == ["m_fp16", "m_fp32"] and chosen["m_fp32"].path == repository / "m_fp32"
    runtime = "models need their own runtime (a TensorRT plan needs a GPU server)"
    assert not_verified == {
        "m_fp16_trt": f"tensorrt_plan {runtime}",
        "m_int8_trt": f"tensorrt {runtime}",
        "m_py": f"python {runtime}",
        "m_u8": "takes uint8 inputs: verify does not turn evaluation samples into uint8 yet (its build's parity gate held it to FP32's outputs)",
        "theirs": "not built by this pipeline (no variant suffix): no build record to judge it by",
    }
    assert plans == {"m_fp16_trt": repository / "m_fp16_trt", "m_int8_trt": repository / "m_int8_trt"}  # by platform or by backend


def test_named_models_are_the_only_ones_looked_at(tmp_path: Path) -> None:
    repository = mixed_repository(tmp_path)
    chosen, not_verified, plans = _servable_models(repository, ["m_fp16", "m_u8"])
    assert list(chosen) == ["m_fp16"] and list(not_verified) == ["m_u8"] and plans == {}


def plan_args(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    return {"embedded": True, "models": [], "calibration_root": tmp_path / "calibration", "batch_size": 8, "gates": Gates(), "eval_data": {},
            "tensorrt": StandInTensorRT()} | changes


def test_models_named_but_not_in_the_repository_are_refused_by_name(tmp_path: Path) -> None:
    repository = mixed_repository(tmp_path)
    with pytest.raises(PipelineError) as info:
        _verification_plan(repository, **plan_args(tmp_path, models=["m_fp32", "m_u8", "nope", "digits_fp32"]))
    assert str(info.value.problem) == f"no servable pipeline ONNX model named ['digits_fp32', 'nope'] in {repository}"
    assert "python -m pipeline build" in str(info.value.fix)


def test_a_repository_with_nothing_verifiable_is_refused(tmp_path: Path) -> None:
    repository = mixed_repository(tmp_path)
    with pytest.raises(PipelineError) as info:  # a not-verifiable model named is no missing model, but nothing is left
        _verification_plan(repository, **plan_args(tmp_path, models=["m_u8"]))
    assert str(info.value.problem) == f"no servable pipeline ONNX model named any in {repository}"


def plan_model(repository: Path, name: str, gpu_cc: str = "9.0") -> None:
    model = add_model(repository, name, platform='platform: "tensorrt_plan"')
    meta = {"tensorrt_version": "10.16.1.11", "gpu": {"name": "NVIDIA H200", "compute_capability": gpu_cc}, "hardware_compatibility": "NONE"}
    (model / ".pipeline-report.json").write_text(json.dumps({"model": name, "versions": {"1": {"engine_metadata": meta}}}))


def test_a_plan_for_another_gpu_is_refused_before_the_embedded_server_starts(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    plan_model(repository, "m_fp16_trt")
    add_model(repository, "m_fp32")
    with pytest.raises(PipelineError) as info:
        _verification_plan(repository, **plan_args(tmp_path, tensorrt=StandInTensorRT(gpu=A100)))
    assert str(info.value.problem) == ("plan m_fp16_trt cannot load there: built for compute capability 9.0 (NVIDIA H200) but this machine "
                                       "(TensorRT 10.16.1.11, NVIDIA A100-SXM4-80GB) has a GPU of compute capability 8.0")
    with pytest.raises(PipelineError, match="built with TensorRT 10.16.1.11 but this machine .* has TensorRT 10.8.0.43"):
        _check_plans_at_hand({"m_fp16_trt": repository / "m_fp16_trt"}, StandInTensorRT(version="10.8.0.43"))
    # another server (--url) is not this machine: its plans are its own business; on to the ONNX models (no data here)
    with pytest.raises(PipelineError, match=r"no evaluation data for any of \['m_fp32'\]"):
        _verification_plan(repository, **plan_args(tmp_path, tensorrt=StandInTensorRT(gpu=A100), embedded=False))
    with pytest.raises(PipelineError, match=r"no evaluation data for any of \['m_fp32'\]"):  # the plan loads on the H200 at hand
        _verification_plan(repository, **plan_args(tmp_path))


class NoGpu(StandInTensorRT):
    """TensorRT and a GPU absent (as the real one is on this machine): nothing says what a plan could load on."""

    def platform(self) -> None:
        return None


def test_without_tensorrt_at_hand_a_plan_is_not_refused(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    plan_model(repository, "m_fp16_trt", gpu_cc="1.0")
    _check_plans_at_hand({"m_fp16_trt": repository / "m_fp16_trt"}, NoGpu())
    with pytest.raises(PipelineError, match="no servable pipeline ONNX model named any"):
        _verification_plan(repository, **plan_args(tmp_path, tensorrt=NoGpu()))
    # no TensorRT given: the installed one is asked (none here, so nothing refused; on a GPU machine this plan cannot load)
    expected = "no servable pipeline ONNX model named any" if PolygraphyTensorRT().platform() is None else "plan m_fp16_trt cannot load"
    with pytest.raises(PipelineError, match=expected):
        _verification_plan(repository, **plan_args(tmp_path, tensorrt=None))
