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

from pipeline.accuracy.evaldata import EvalBucket, EvalData
from pipeline.accuracy.gates import Gates
from pipeline.accuracy.outputkinds import OutputKind
from pipeline.backend.tensorrt_env import GpuInfo
from pipeline.backend.trt_seam import PolygraphyTensorRT
from pipeline.core.errors import CheckFailed, PipelineError
from pipeline.triton.repository import read_repository
from pipeline.triton.served_gate import ServedResult
from pipeline.triton.verify import (_check_plans_at_hand, _fix_for, _plan, _planned, _recorded_gates, _servable_models, _served_atol, _verdict,
                                    _verification_plan, served_against_file)
from tests.onnx_graphs import bias_model
from tests.trt_standin import StandInTensorRT

PROBS = OutputKind("probs", "classes", "recorded by its build", classes=3)
FLAG = OutputKind("flag", "binary", "recorded by its build")
KINDS = {"probs": PROBS, "flag": FLAG}
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", (8, 0))


def version_weights(version: int) -> np.ndarray:
    """The weights of a model's version ``version`` (each version its own)."""
    return np.random.default_rng(version).normal(size=(4, 4))


def two_outputs_onnx(path: Path, weights: np.ndarray) -> Path:
    """x [batch, 4] → 'probs' = softmax(x @ weights[:, :3]) [batch, 3] (class scores) and 'flag' = sigmoid(x @ weights[:, 3:]) [batch, 1]."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
         helper.make_node("MatMul", ["x", "v"], ["flag_logit"]), helper.make_node("Sigmoid", ["flag_logit"], ["flag"])],
        "two_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 3]), helper.make_tensor_value_info("flag", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(weights[:, :3].astype(np.float32), "w"), numpy_helper.from_array(weights[:, 3:].astype(np.float32), "v")],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def by_numpy(x: np.ndarray, weights: np.ndarray) -> dict[str, np.ndarray]:
    """What two_outputs_onnx computes, worked out in float64."""
    logits = x.astype(np.float64) @ weights[:, :3]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return {"probs": (e / e.sum(axis=1, keepdims=True)).astype(np.float32), "flag": (1 / (1 + np.exp(-(x @ weights[:, 3:])))).astype(np.float32)}


def add_model(repository: Path, name: str, *, platform: str = 'platform: "onnxruntime_onnx"', max_batch: int = 8, versions: tuple[int, ...] = (1,),
              build: dict[str, Any] | None = None, filename: str = "model.onnx") -> Path:
    """One model folder as publish writes it: config.pbtxt, numeric versions, and the build report when ``build`` is given."""
    model = repository / name
    model.mkdir(parents=True)
    extra = f'default_model_filename: "{filename}"\n' if filename != "model.onnx" else ""
    (model / "config.pbtxt").write_text(f'name: "{name}"\n{platform}\nmax_batch_size: {max_batch}\n{extra}')
    for version in versions:
        two_outputs_onnx(model / str(version) / filename, version_weights(version))
    if build is not None:
        (model / ".pipeline-report.json").write_text(json.dumps({"model": name, "versions": {str(v): {"build": build} for v in versions}}))
    return model


def eval_npz(path: Path, rng: np.random.Generator, n: int = 10, **labels: np.ndarray) -> Path:
    """``n`` samples of 'x' and plain class labels (or the ``labels`` given, by array name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=rng.normal(size=(n, 4)).astype(np.float32), **(labels or {"labels": rng.integers(0, 3, n)}))
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


def test_only_the_pipelines_onnx_variants_are_verified_and_every_other_model_says_why(tmp_path: Path) -> None:
    repository = mixed_repository(tmp_path)
    chosen, not_verified, plans = _servable_models(repository, [])
    assert sorted(chosen) == ["m_fp16", "m_fp32", "m_u8"] and chosen["m_fp32"].path == repository / "m_fp32"
    runtime = "models need their own runtime (a TensorRT plan needs a GPU server)"
    assert not_verified == {
        "m_fp16_trt": f"tensorrt_plan {runtime}",
        "m_int8_trt": f"tensorrt {runtime}",
        "m_py": "python models need their own runtime",  # no TensorRT in it: nothing about a GPU
        "theirs": "not built by this pipeline (no variant suffix): no build record to judge it by",
    }
    assert plans == {"m_fp16_trt": repository / "m_fp16_trt", "m_int8_trt": repository / "m_int8_trt"}  # by platform or by backend


def test_named_models_are_the_only_ones_looked_at(tmp_path: Path) -> None:
    repository = mixed_repository(tmp_path)
    chosen, not_verified, plans = _servable_models(repository, ["m_fp16", "theirs"])
    assert list(chosen) == ["m_fp16"] and list(not_verified) == ["theirs"] and plans == {}


def plan_args(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    return {"embedded": True, "models": [], "calibration_root": tmp_path / "calibration", "batch_size": 8, "gates": Gates(), "eval_data": {},
            "tensorrt": StandInTensorRT()} | changes


def test_models_named_but_not_in_the_repository_are_refused_by_name(tmp_path: Path) -> None:
    repository = mixed_repository(tmp_path)
    with pytest.raises(PipelineError) as info:
        _verification_plan(repository, **plan_args(tmp_path, models=["m_fp32", "theirs", "nope", "digits_fp32"]))
    assert str(info.value.problem) == f"no servable pipeline ONNX model named ['digits_fp32', 'nope'] in {repository}"
    assert str(info.value.fix) == "run `python -m pipeline build` or check --model"


def test_a_repository_with_nothing_verifiable_is_refused(tmp_path: Path) -> None:
    repository = mixed_repository(tmp_path)
    with pytest.raises(PipelineError) as info:  # a not-verifiable model named is no missing model, but nothing is left
        _verification_plan(repository, **plan_args(tmp_path, models=["theirs"]))
    assert str(info.value.problem) == f"no servable pipeline ONNX model named any in {repository}"


def test_a_verifiable_repository_is_planned_with_this_commands_drop_limits(tmp_path: Path) -> None:
    repository = mixed_repository(tmp_path)
    eval_npz(tmp_path / "calibration" / "m" / "eval.npz", np.random.default_rng(19))
    command = Gates(fp16_max_drop=0.25, int8_max_drop=3.0, gate_confidence=0.8)
    planned, limits, not_verified = _verification_plan(repository, **plan_args(tmp_path, gates=command, embedded=False))
    assert sorted(planned) == sorted(limits) == ["m_fp16", "m_fp32"] and "theirs" in not_verified
    # a uint8-input variant whose file records no scale cannot have float samples turned into its uint8
    assert not_verified["m_u8"] == ("its model file records no uint8 input scale (pipeline.uint8_input_scale), so float samples "
                                    "cannot be sent as uint8: rebuild it with --uint8-input")
    assert {(g.fp16_max_drop, g.int8_max_drop, g.gate_confidence) for g in limits.values()} == {(0.25, 3.0, 0.8)}


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


# --- what each model is verified on ----------------------------------------------------------------------------


def published(repository: Path, name: str) -> Any:
    return read_repository(repository)[name]


def test_the_newest_version_is_verified_on_the_data_and_kinds_its_build_recorded(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    data = eval_npz(tmp_path / "recorded.npz", rng)
    eval_npz(tmp_path / "calibration" / "m" / "eval.npz", rng, n=3)  # the build's own record comes first
    repository = tmp_path / "repo"
    add_model(repository, "m_fp32", versions=(1, 3, 2), filename="net.onnx",
              build={"output_kinds": [PROBS.as_dict(), FLAG.as_dict()], "eval_data": str(data)})
    version, model_file, planned, kinds = _plan("m_fp32", published(repository, "m_fp32"), "m", None, tmp_path / "calibration")  # type: ignore[misc]
    assert version == 3 and model_file == repository / "m_fp32" / "3" / "net.onnx"
    assert planned.source == str(data) and planned.num_samples == 10
    assert planned.target_names == ["probs"]  # plain labels belong to the first class-score output
    np.testing.assert_array_equal(planned.targets_of("probs"), np.load(data)["labels"])
    assert kinds == {"probs": PROBS, "flag": FLAG}


def test_data_given_on_the_command_line_comes_before_the_recorded_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    repository = tmp_path / "repo"
    add_model(repository, "m_fp16", build={"output_kinds": [PROBS.as_dict(), FLAG.as_dict()], "eval_data": str(eval_npz(tmp_path / "rec.npz", rng))})
    model = published(repository, "m_fp16")
    given = eval_npz(tmp_path / "given.npz", rng, n=7, **{"labels:flag": rng.integers(0, 2, (7, 1))})
    planned = _plan("m_fp16", model, "m", given, tmp_path)[2]  # type: ignore[index]
    assert planned.source == str(given) and planned.num_samples == 7 and planned.target_names == ["flag"]
    x = rng.normal(size=(5, 4)).astype(np.float32)
    in_memory = EvalData.single({"x": x}, np.array([0, 1, 2, 1, 0]), "in memory", "f")
    planned = _plan("m_fp16", model, "m", in_memory, tmp_path)[2]  # type: ignore[index]
    assert planned.source == "in memory" and planned.target_names == ["probs"]
    np.testing.assert_array_equal(next(planned.batches(8))["x"], x)
    with pytest.raises(PipelineError, match=f"'{tmp_path / 'missing'}' does not exist"):  # a float model's data is read as it is
        _plan("m_fp16", model, "m", tmp_path / "missing", tmp_path)


def image_model_onnx(path: Path, weights: np.ndarray) -> Path:
    """x [batch, 2, 2, 1] (an NHWC image) → 'probs' = softmax(flatten(x) @ weights) [batch, 3]."""
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["flat"], axis=1), helper.make_node("MatMul", ["flat", "w"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)],
        "image", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 2, 1])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 3])], [numpy_helper.from_array(weights.astype(np.float32), "w")],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_uint8_input_variant_is_verified_on_the_float_samples_as_a_client_sends_them(tmp_path: Path) -> None:
    """The u8 variant's data: the base model's float samples turned into uint8 with the scale its file records
    (round(x / scale), clipped), labels kept; the same data as floats for its FP32 sibling."""
    from pipeline.stages.uint8_input import uint8_input_onnx_from_onnx

    rng = np.random.default_rng(14)
    repository = tmp_path / "repo"
    build = {"output_kinds": [PROBS.as_dict()]}
    weights = rng.normal(size=(4, 3))
    for name in ("m_fp32", "m_u8"):
        add_model(repository, name, build=build)
    image_model_onnx(repository / "m_fp32" / "1" / "model.onnx", weights)
    uint8_input_onnx_from_onnx(repository / "m_fp32" / "1" / "model.onnx", repository / "m_u8" / "1" / "model.onnx", scale=0.25)
    x = np.concatenate([rng.integers(0, 9, (6, 2, 2, 1)) * 0.25, [np.full((2, 2, 1), 0.3), np.full((2, 2, 1), 99.0)]]).astype(np.float32)
    labels = rng.integers(0, 3, len(x))
    np.savez(data := tmp_path / "eval.npz", x=x, labels=labels)
    fp32 = _plan("m_fp32", published(repository, "m_fp32"), "m", data, tmp_path)[2]  # type: ignore[index]
    u8 = _plan("m_u8", published(repository, "m_u8"), "m", data, tmp_path)[2]  # type: ignore[index]
    wire = next(u8.batches(16))["x"]
    assert wire.dtype == np.uint8 and u8.source == f"{data} (as uint8)" and u8.fingerprint != fp32.fingerprint
    np.testing.assert_array_equal(wire[:6], np.rint(x[:6] / 0.25))
    assert wire[6].ravel().tolist() == [1] * 4 and wire[7].ravel().tolist() == [255] * 4  # 0.3 / 0.25 rounds to 1; 99 / 0.25 clips
    np.testing.assert_array_equal(u8.targets_of("probs"), labels)
    np.testing.assert_array_equal(next(fp32.batches(16))["x"], x)
    # in process the variant on that uint8 computes what FP32 does on the same values as floats
    served = [dict(zip(["probs"], onnxruntime_run(repository / "m_fp32" / "1" / "model.onnx", {"x": wire[:6].astype(np.float32) * 0.25})))]
    result = served_against_file("m_u8", repository / "m_u8" / "1" / "model.onnx", _head(u8, 6), {"probs": PROBS}, served, batch_size=16,
                                 atol=1e-6, threshold=0.5)
    assert result.failures == [] and result.precision == "u8" and result.samples == 6
    # in memory data (a build's --verify-served) is turned into uint8 as well
    in_memory = EvalData.single({"x": x}, labels, "in memory", "f")
    np.testing.assert_array_equal(next(_plan("m_u8", published(repository, "m_u8"), "m", in_memory, tmp_path)[2].batches(16))["x"], wire)  # type: ignore[index]
    with pytest.raises(PipelineError, match=f"'{tmp_path / 'missing.npz'}' does not exist"):
        _plan("m_u8", published(repository, "m_u8"), "m", tmp_path / "missing.npz", tmp_path)
    # samples stored as uint8 (in a file or in memory) already are what a client sends: as they are, not divided again
    np.savez(stored := tmp_path / "eval_u8.npz", x=wire, labels=labels)
    for given in (stored, EvalData.single({"x": wire}, labels, "in memory", "u")):
        np.testing.assert_array_equal(next(_plan("m_u8", published(repository, "m_u8"), "m", given, tmp_path)[2].batches(16))["x"], wire)  # type: ignore[index]


def onnxruntime_run(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    from pipeline.backend.onnxrt import session_from_onnx

    return session_from_onnx(path).run(None, feed)


def _head(data: EvalData, count: int) -> EvalData:
    return EvalData(tuple(EvalBucket(b.name, {k: v[:count] for k, v in b.inputs.items()}, {k: v[:count] for k, v in b.targets.items()})
                          for b in data.buckets), data.source, data.fingerprint)


def test_without_recorded_data_the_calibration_roots_eval_set_is_used_and_without_it_the_model_is_not_verified(tmp_path: Path) -> None:
    rng = np.random.default_rng(13)
    repository = tmp_path / "repo"
    add_model(repository, "m_int8", build={"output_kinds": [PROBS.as_dict(), FLAG.as_dict()]})
    model = published(repository, "m_int8")
    assert _plan("m_int8", model, "m", None, tmp_path / "calibration") == (
        f"no evaluation data (none recorded by its build, no {tmp_path / 'calibration' / 'm' / 'eval.npz'}): pass --eval-data")
    data = eval_npz(tmp_path / "calibration" / "m" / "eval.npz", rng, n=4)
    assert _plan("m_int8", model, "m", None, tmp_path / "calibration")[2].source == str(data)  # type: ignore[index]


def test_a_model_without_recorded_kinds_is_judged_by_what_its_graph_computes_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(14)
    repository = tmp_path / "repo"
    add_model(repository, "m_fp32", build={"eval_data": str(eval_npz(tmp_path / "e.npz", rng))})
    with caplog.at_level(logging.WARNING, logger="pipeline.triton.verify"):
        kinds = _plan("m_fp32", published(repository, "m_fp32"), "m", None, tmp_path)[3]  # type: ignore[index]
    assert {k.name: (k.kind, k.classes) for k in kinds.values()} == {"probs": ("classes", 3), "flag": ("binary", None)}
    assert "m_fp32: no output kinds recorded by its build; judged as probs=classes, flag=binary" in caplog.messages


def test_labels_that_do_not_fit_the_output_are_refused_before_any_model_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(15)
    repository = tmp_path / "repo"
    add_model(repository, "m_fp32", build={"output_kinds": [PROBS.as_dict(), FLAG.as_dict()]})
    bad = eval_npz(tmp_path / "bad.npz", rng, n=6, labels=np.array([0, 1, 2, 3, 1, 0]))
    with pytest.raises(PipelineError, match=r"labels of output 'probs' \(classes\) in .*bad.npz run from 0 to 3, but the output has 3 classes"):
        _plan("m_fp32", published(repository, "m_fp32"), "m", bad, tmp_path)
    np.savez(tmp_path / "buckets.npz", x__a=rng.normal(size=(3, 4)).astype(np.float32), labels__a=np.array([0, 1, 2]),
             x__b=rng.normal(size=(2, 4)).astype(np.float32), labels__b=np.array([2, 5]))
    with pytest.raises(PipelineError, match=r"run from 2 to 5, but the output has 3 classes"):  # every bucket is checked, not the first only
        _plan("m_fp32", published(repository, "m_fp32"), "m", tmp_path / "buckets.npz", tmp_path)


def test_deciding_the_kinds_reads_the_graph_not_the_weights(tmp_path: Path) -> None:
    """A large model keeps its weights in a file beside model.onnx: deciding its output kinds needs none of them."""
    rng = np.random.default_rng(17)
    repository = tmp_path / "repo"
    add_model(repository, "m_fp32", build={"eval_data": str(eval_npz(tmp_path / "e.npz", rng))})
    model_file = repository / "m_fp32" / "1" / "model.onnx"
    onnx.save(onnx.load(str(model_file)), str(model_file), save_as_external_data=True, location="weights.bin", size_threshold=0)
    (model_file.parent / "weights.bin").unlink()  # unreadable weights: only a load of them can fail
    kinds = _plan("m_fp32", published(repository, "m_fp32"), "m", None, tmp_path)[3]  # type: ignore[index]
    assert {k.name: k.kind for k in kinds.values()} == {"probs": "classes", "flag": "binary"}


def test_plain_labels_beside_labels_named_for_their_output_are_refused_naming_the_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(18)
    repository = tmp_path / "repo"
    add_model(repository, "m_fp32", build={"output_kinds": [PROBS.as_dict(), FLAG.as_dict()]})
    both = eval_npz(tmp_path / "both.npz", rng, n=4, labels=np.array([0, 1, 2, 0]), **{"labels:probs": np.array([0, 1, 2, 0])})
    with pytest.raises(PipelineError) as info:
        _plan("m_fp32", published(repository, "m_fp32"), "m", both, tmp_path)
    assert str(info.value.problem) == f"evaluation data {both} has both 'labels' and 'labels:probs'"


def test_the_variants_of_one_model_share_the_smallest_batch_and_a_model_without_data_is_listed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(16)
    repository, calibration = tmp_path / "repo", tmp_path / "calibration"
    kinds = {"output_kinds": [PROBS.as_dict(), FLAG.as_dict()]}
    add_model(repository, "a_fp32", build=kinds)  # no data anywhere (and first in line: the others are still planned)
    add_model(repository, "m_fp32", max_batch=8, build=kinds | {"gates": {"binary_threshold": 0.3}})
    add_model(repository, "m_fp16", max_batch=4, build=kinds | {"gates": {"binary_threshold": 0.7}})
    add_model(repository, "n_fp32", max_batch=0)  # no batching: the command's batch size; no kinds recorded
    eval_npz(calibration / "n_fp32" / "eval.npz", rng)  # data of its own
    given = {"m": EvalData.single({"x": rng.normal(size=(5, 4)).astype(np.float32)}, None, "given", "f")}
    chosen, not_verified, _ = _servable_models(repository, [])
    with caplog.at_level(logging.WARNING, logger="pipeline.triton.verify"):
        planned, limits = _planned(chosen, not_verified, given, calibration, 16, Gates())
    assert {name: plan[4] for name, plan in planned.items()} == {"m_fp16": 4, "m_fp32": 4, "n_fp32": 16}
    assert {name: plan[2].source for name, plan in planned.items()} == {"m_fp16": "given", "m_fp32": "given", "n_fp32": str(calibration / "n_fp32" / "eval.npz")}
    why = f"no evaluation data (none recorded by its build, no {calibration / 'a' / 'eval.npz'}): pass --eval-data"
    assert not_verified == {"a_fp32": why} and f"a_fp32: not verified: {why}" in caplog.messages
    assert "n_fp32: no output kinds recorded by its build; judged as probs=classes, flag=binary" in caplog.messages
    assert {name: gates.binary_threshold for name, gates in limits.items()} == {"m_fp16": 0.7, "m_fp32": 0.3, "n_fp32": 0.5}
    planned, _ = _planned(chosen, {}, given, calibration, 2, Gates())
    assert {name: plan[4] for name, plan in planned.items()} == {"m_fp16": 2, "m_fp32": 2, "n_fp32": 2}
    with pytest.raises(PipelineError) as info:
        _planned(chosen, {}, {}, tmp_path / "elsewhere", 16, Gates())
    assert str(info.value.problem) == "no evaluation data for any of ['a_fp32', 'm_fp16', 'm_fp32', 'n_fp32']"
    assert str(info.value.fix) == "pass --eval-data PATH.npz (one array per input name, plus labels)"


# --- the limits ------------------------------------------------------------------------------------------------


def test_a_model_is_held_to_the_limits_its_build_recorded_with_this_commands_drop_limits_and_confidence(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    recorded = {"fp16_atol": 0.05, "int8_atol": 0.2, "binary_threshold": 0.3, "fp16_max_drop": 5.0, "int8_max_drop": 7.0, "gate_confidence": 0.5,
                "a_limit_of_a_later_version": 1.0}
    model = add_model(repository, "m_fp16", build={"gates": recorded})
    command = Gates(fp16_max_drop=0.5, int8_max_drop=2.0, gate_confidence=0.9, fp16_atol=0.001, binary_threshold=0.6)
    assert _recorded_gates(model, command) == Gates(fp16_atol=0.05, int8_atol=0.2, binary_threshold=0.3, fp16_max_drop=0.5, int8_max_drop=2.0,
                                                    gate_confidence=0.9)
    for build in (None, {"gates": None}):  # not built by the pipeline, or recorded nothing: the defaults, with this command's drops
        other = add_model(repository, f"n{len(list(repository.iterdir()))}_fp16", build=build)
        assert _recorded_gates(other, command) == Gates(fp16_max_drop=0.5, int8_max_drop=2.0, gate_confidence=0.9)


@pytest.mark.parametrize("model, fp16_atol, expected", [
    ("m_fp16", 0.01, 0.01),  # a GPU's FP16 kernels against this CPU's: FP16's own limit
    ("m_fp16", 1e-4, 1e-3),  # never tighter than --atol
    ("m_fp16", None, 1e-3),
    ("m_int8", 0.01, 1e-3),
    ("m_fp32", 0.01, 1e-3),
    ("theirs", 0.01, 1e-3),  # no variant suffix: served as FP32
])
def test_fp16_served_is_held_to_fp16s_own_tolerance_and_the_rest_to_atol(model: str, fp16_atol: float | None, expected: float) -> None:
    assert _served_atol(model, 1e-3, Gates(fp16_atol=fp16_atol)) == expected


# --- what came back, against the file in process ---------------------------------------------------------------


def test_what_came_back_is_judged_against_the_served_file_with_its_labels(tmp_path: Path) -> None:
    """Served answers worked out in numpy: the task metrics are the served ones against the labels, at the recorded threshold."""
    rng = np.random.default_rng(21)
    repository = tmp_path / "repo"
    add_model(repository, "m_fp16", versions=(1, 2))
    x = rng.normal(size=(20, 4)).astype(np.float32)
    classes, flags = rng.integers(0, 3, 20), rng.integers(0, 2, (20, 1))
    data = EvalData((EvalBucket("", {"x": x}, {"probs": classes, "flag": flags}),), "test", "f")
    served = [by_numpy(x[i : i + 8], version_weights(2)) for i in range(0, 20, 8)]
    served[1]["probs"][3] = np.roll(served[1]["probs"][3], 1)  # one served answer moved to another class
    kinds = {"flag": FLAG, "probs": PROBS}  # not the graph's order: outputs are matched by name
    result = served_against_file("m_fp16", repository / "m_fp16" / "2" / "model.onnx", data, kinds, served, batch_size=8, atol=1.0, threshold=0.8)
    right = by_numpy(x, version_weights(2))
    assert (result.model, result.base, result.precision, result.version, result.samples) == ("m_fp16", "m", "fp16", 2, 20)
    assert result.failures == [] and result.served is served and result.kinds == kinds  # the kinds judge it against served FP32 next
    probs = result.outputs["probs"]
    assert probs["inprocess_metric"] == pytest.approx(np.mean(right["probs"].argmax(1) == classes))
    served_probs = np.concatenate([b["probs"] for b in served])
    assert probs["served_metric"] == pytest.approx(np.mean(served_probs.argmax(1) == classes)) and probs["agreement"] == pytest.approx(0.95)
    assert result.outputs["flag"]["served_metric"] == pytest.approx(np.mean((right["flag"] > 0.8) == flags))
    assert result.outputs["flag"]["served_metric"] != pytest.approx(np.mean((right["flag"] > 0.5) == flags))  # the threshold matters here
    assert [sorted(t) for t in result.targets] == [["flag", "probs"]] * 3
    np.testing.assert_array_equal(np.concatenate([t["probs"] for t in result.targets]), classes)
    strict = served_against_file("m_fp16", repository / "m_fp16" / "2" / "model.onnx", data, KINDS, served, batch_size=8, atol=1e-3, threshold=0.8)
    assert strict.failures == [f"output 'probs' served differs from in-process by up to {probs['max_abs_diff']:.3g} (> 0.001)"]
    assert probs["max_abs_diff"] == pytest.approx(np.abs(served_probs - right["probs"]).max(), abs=1e-6)
    with pytest.raises(ValueError):  # an answer missing for a batch: never judged on the batches that came back
        served_against_file("m_fp16", repository / "m_fp16" / "2" / "model.onnx", data, KINDS, served[:2], batch_size=8, atol=1.0, threshold=0.8)


def test_an_int8_model_served_with_qdq_fused_into_integer_kernels_fails_and_served_exactly_passes(tmp_path: Path) -> None:
    model_file = bias_model(tmp_path / "repo" / "m_int8" / "1" / "model.onnx")
    x = np.array([1.2, -2.0, 3.0, 0.4], np.float32).reshape(1, 1, 2, 2)
    data = EvalData.single({"x": x}, None, "test", "f")
    kinds = {"y": OutputKind("y", "regression", "test")}
    w, b = np.array([2.0, 3.0], np.float32).reshape(1, 2, 1, 1), np.array([0.6, -0.4], np.float32).reshape(1, 2, 1, 1)
    exact = (np.rint(np.maximum(np.rint(x) * w + b, 0) / 2) * 2).astype(np.float32)  # Q/DQ as written (round half to even), in numpy
    fused = (np.rint(np.maximum(np.rint(x) * w + np.rint(b), 0) / 2) * 2).astype(np.float32)  # the bias rounded to int32 first
    assert exact[0, 0, 0, 0] == 2.0 and fused[0, 0, 0, 0] == 4.0  # 2·1 + 0.6 → round(1.3) = 1 → 2; 2·1 + 1 → round(1.5) = 2 → 4
    passed = served_against_file("m_int8", model_file, data, kinds, [{"y": exact}], batch_size=4, atol=1e-3, threshold=0.5)
    assert passed.failures == [] and passed.outputs["y"]["max_abs_diff"] == 0.0
    failed = served_against_file("m_int8", model_file, data, kinds, [{"y": fused}], batch_size=4, atol=1e-3, threshold=0.5)
    assert failed.failures == ["output 'y' served differs from in-process by up to 2 (> 0.001)"]
    # a model without a variant suffix is FP32: its file runs as ONNX Runtime runs it by default, which is what a server fusing Q/DQ gives
    theirs = served_against_file("theirs", model_file, data, kinds, [{"y": fused}], batch_size=4, atol=1e-3, threshold=0.5)
    assert (theirs.base, theirs.precision, theirs.failures) == ("theirs", "fp32", [])


# --- the verdict and the report --------------------------------------------------------------------------------


def one_hot(classes: np.ndarray) -> np.ndarray:
    return np.eye(3, dtype=np.float32)[classes]


def served_results(rng: np.random.Generator, int8_wrong: int) -> list[ServedResult]:
    """Served FP32 right on every sample, served FP16 equal to it, served INT8 wrong on the first ``int8_wrong`` of 300."""
    truth = [rng.integers(0, 3, 100) for _ in range(3)]
    fp32 = [{"probs": one_hot(t)} for t in truth]
    moved = np.concatenate(truth)
    moved[:int8_wrong] = (moved[:int8_wrong] + 1) % 3
    int8 = [{"probs": one_hot(moved[i : i + 100])} for i in range(0, 300, 100)]
    kinds = {"probs": PROBS}
    return [ServedResult(m, "m", p, 1, 300, {}, [], kinds=kinds, served=s, targets=[{"probs": t} for t in truth])
            for m, p, s in (("m_fp32", "fp32", fp32), ("m_fp16", "fp16", fp32), ("m_int8", "int8", int8))]


def test_the_report_lists_every_model_and_every_model_not_verified_and_is_shown(tmp_path: Path) -> None:
    results = served_results(np.random.default_rng(31), int8_wrong=0)
    limits = {r.model: Gates() for r in results}
    shown: list[list[dict]] = []
    report_path = tmp_path / "reports" / "served" / "v.json"
    not_verified = {"m_py": "python models need their own runtime", "m_fp16_trt": "a plan"}
    report = _verdict(results, limits, not_verified, url=None, repository=tmp_path / "repo", report_path=report_path, show=shown.append)
    text = report_path.read_text()
    assert text.startswith('{\n  "url": "embedded",\n  "repository": ') and text.endswith("}\n")
    assert json.loads(text) == report
    assert report["repository"] == str(tmp_path / "repo") and report["not_verified"] == not_verified
    datetime.strptime(report["time"], "%Y-%m-%dT%H:%M:%S")
    assert [(row["model"], row["passed"]) for row in report["models"]] == [("m_fp32", True), ("m_fp16", True), ("m_int8", True)]
    assert report["models"][2]["gates"] and report["models"][2]["gates"][0]["verdict"] == "pass"  # judged against served FP32
    assert shown == [report["models"] + [{"model": "m_fp16_trt", "not_verified": "a plan"}, {"model": "m_py", "not_verified": "python models need their own runtime"}]]
    assert _verdict(served_results(np.random.default_rng(31), 0), limits, {}, url="gpu-box:8000", repository=tmp_path, report_path=report_path,
                    show=None)["url"] == "gpu-box:8000"
    assert json.loads(report_path.read_text())["url"] == "gpu-box:8000"


def test_the_fix_names_what_to_look_at_for_the_precisions_that_failed() -> None:
    qdq = "for INT8, make sure the server keeps Q/DQ exact (optimization graph level 2 in config.pbtxt)"
    scale = "for a uint8-input variant, check the scale recorded in its model file against how its inputs are scaled (--uint8-input)"
    other = "compare the served outputs with the report's rows; the server log says what runtime served each model"

    def failed(precision: str, why: str) -> ServedResult:
        return ServedResult(f"m_{precision}", "m", precision, 1, 10, {}, [why])

    drift, against = "output 'probs' served differs from in-process by up to 0.5 (> 0.001)", "served vs served FP32: output 'probs' (classes): ..."
    assert _fix_for([failed("int8", drift), failed("fp16", against)]) == _fix_for([failed("int8", against)]) == qdq
    assert _fix_for([failed("u8", against)]) == scale and _fix_for([failed("u8", against), failed("int8", drift)]) == f"{qdq}; {scale}"
    # served and in process read the same file and samples: a u8 variant drifting from its own file is no scale's doing
    assert _fix_for([failed("u8", drift)]) == _fix_for([failed("fp16", against)]) == _fix_for([failed("int8cpu", against)]) == other


def test_a_variant_worse_than_served_fp32_fails_the_check_in_one_line_naming_every_failure(tmp_path: Path) -> None:
    results = served_results(np.random.default_rng(32), int8_wrong=100)  # a third of INT8's answers wrong: 33.33 points
    results[1].failures.append("output 'probs' served differs from in-process by up to 0.5 (> 0.001)")
    results[2].failures.append("output 'probs': 1 NaN/Inf values served where in-process ones are finite")
    report_path = tmp_path / "v.json"
    with pytest.raises(CheckFailed) as info:
        _verdict(results, {r.model: Gates() for r in results}, {}, url=None, repository=tmp_path, report_path=report_path, show=None)
    problem = str(info.value.problem)
    assert problem.startswith("served accuracy check failed: m_fp16: output 'probs' served differs from in-process by up to 0.5 (> 0.001); "
                              "m_int8: output 'probs': 1 NaN/Inf values served where in-process ones are finite, "
                              "served vs served FP32: output 'probs' (classes): accuracy drop (top-1) 33.33 points")
    assert problem.endswith(f" (report: {report_path})") and "m_fp32" not in problem
    assert str(info.value.fix) == "for INT8, make sure the server keeps Q/DQ exact (optimization graph level 2 in config.pbtxt)"
    rows = {row["model"]: row["passed"] for row in json.loads(report_path.read_text())["models"]}
    assert rows == {"m_fp32": True, "m_fp16": False, "m_int8": False}  # the report is written before the check fails
    # the limits are each model's: a 50-point INT8 limit lets the same answers pass
    results = served_results(np.random.default_rng(32), int8_wrong=100)
    report = _verdict(results, {r.model: Gates(int8_max_drop=50.0) for r in results}, {}, url=None, repository=tmp_path, report_path=report_path,
                      show=None)
    assert all(row["passed"] for row in report["models"])
