"""Triton model configs built from real tiny ONNX models, parsed back with real protobuf."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from publish_harness import two_io_onnx, warmup_data
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.core.errors import PipelineError
from pipeline.data.artifacts import Artifact, parse_variant
from pipeline.data.tensors import signature_from_onnx
from pipeline.triton.config import (
    check_config_against_engine,
    check_config_against_onnx,
    config_text,
    model_config_from_artifact,
    ort_graph_level_name,
    parse_config,
    triton_dtype,
    warmup_files,
    warmup_input_bytes,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_io_onnx(tmp_path_factory.mktemp("onnx") / "two_io.onnx")


def build(model: Path, **kwargs: object) -> mc.ModelConfig:
    settings: dict[str, object] = {"name": "digits_fp32", "signature": signature_from_onnx(model), "max_batch": 8, "preferred_batch_sizes": [4], "max_queue_delay_us": 250}
    settings.update(kwargs)
    return model_config_from_artifact(Artifact("fp32", "onnx", model), **settings)  # type: ignore[arg-type]


def test_io_comes_from_the_model_and_parses_back(model: Path) -> None:
    cfg = build(model, labels_file="labels.txt", classifier_output="probs")
    assert (cfg.platform, cfg.backend, cfg.default_model_filename, cfg.max_batch_size) == ("onnxruntime_onnx", "onnxruntime", "model.onnx", 8)
    assert [(i.name, mc.DataType.Name(i.data_type), list(i.dims)) for i in cfg.input] == [("image", "TYPE_FP32", [8, 8, 1]), ("ids", "TYPE_INT64", [-1])]
    assert [(o.name, mc.DataType.Name(o.data_type), list(o.dims)) for o in cfg.output] == [("probs", "TYPE_FP32", [10]), ("count", "TYPE_INT64", [1])]
    # A [batch] output: Triton needs dims [1] and a reshape to [] (model_configuration.md, "Reshape").
    assert cfg.output[1].HasField("reshape") and list(cfg.output[1].reshape.shape) == []
    assert cfg.output[0].label_filename == "labels.txt" and not cfg.output[1].label_filename
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4] and cfg.dynamic_batching.max_queue_delay_microseconds == 250
    assert [(g.kind, g.count) for g in cfg.instance_group] == [(mc.ModelInstanceGroup.KIND_AUTO, 1)]
    assert ort_graph_level_name(cfg) == "ORT_ENABLE_ALL"  # float model: no graph level set
    text = config_text(cfg)
    assert parse_config(text) == cfg
    assert 'platform: "onnxruntime_onnx"' in text and "label_filename" in text


def test_no_batching_keeps_the_batch_axis(model: Path) -> None:
    cfg = build(model, max_batch=0, preferred_batch_sizes=[])
    assert [list(i.dims) for i in cfg.input] == [[-1, 8, 8, 1], [-1, -1]]
    assert not cfg.HasField("dynamic_batching")
    with pytest.raises(PipelineError, match="preferred batch sizes need batching"):
        build(model, max_batch=0, preferred_batch_sizes=[4])
    with pytest.raises(PipelineError, match=r"preferred batch sizes \[16\] are outside 1..8"):
        build(model, preferred_batch_sizes=[4, 16])


def test_fixed_first_axis_cannot_batch(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    path = tmp_path / "fixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(PipelineError, match="first axis is not a dynamic batch axis"):
        build(path, preferred_batch_sizes=[])
    assert [list(i.dims) for i in build(path, max_batch=0, preferred_batch_sizes=[]).input] == [[1, 4]]


def test_labels_need_a_real_classifier_output(model: Path) -> None:
    with pytest.raises(PipelineError, match="no output named 'scores'"):
        build(model, labels_file="labels.txt", classifier_output="scores")
    with pytest.raises(PipelineError, match="needs a classifier output"):
        build(model, labels_file="labels.txt")
    with pytest.raises(PipelineError, match="not a plain file name"):
        build(model, labels_file="../labels.txt", classifier_output="probs")


def test_warmup_uses_real_samples_as_raw_little_endian_files(model: Path) -> None:
    data = warmup_data()
    signature = signature_from_onnx(model)
    cfg = build(model, warmup=data, preferred_batch_sizes=[2, 4])
    assert [(w.name, w.batch_size) for w in cfg.model_warmup] == [("real_sample_batch_1", 1), ("real_sample_batch_2", 2), ("real_sample_batch_4", 4), ("real_sample_batch_8", 8)]
    image, ids = cfg.model_warmup[0].inputs["image"], cfg.model_warmup[0].inputs["ids"]
    assert (list(image.dims), image.input_data_file, mc.DataType.Name(image.data_type)) == ([8, 8, 1], "image.bin", "TYPE_FP32")
    assert (list(ids.dims), ids.input_data_file) == ([4], "ids.bin")  # the dynamic 'seq' axis takes the sample's length
    files = warmup_files(signature, data, 8)
    assert sorted(files) == ["warmup/ids.bin", "warmup/image.bin"]
    # One sample (the first), without the batch axis; Triton repeats it batch_size times.
    assert files["warmup/image.bin"] == data["image"][0].astype("<f4").tobytes()
    assert np.array_equal(np.frombuffer(files["warmup/ids.bin"], "<i8"), data["ids"][0])
    assert [warmup_input_bytes(image), warmup_input_bytes(ids)] == [len(files["warmup/image.bin"]), len(files["warmup/ids.bin"])]
    assert parse_config(config_text(cfg)) == cfg


def test_warmup_rejects_samples_that_do_not_fit(model: Path) -> None:
    data = warmup_data()
    with pytest.raises(PipelineError, match="warmup data has no array for input 'ids'"):
        build(model, warmup={"image": data["image"]})
    with pytest.raises(PipelineError, match=r"has shape \(8, 8, 3\), the model wants \[8, 8, 1\]"):
        build(model, warmup={**data, "image": np.zeros((2, 8, 8, 3))})
    with pytest.raises(PipelineError, match="not model inputs"):
        build(model, warmup={**data, "extra": np.zeros(3)})
    with pytest.raises(PipelineError, match="warmup array 'ids' is float64"):
        build(model, warmup={**data, "ids": np.zeros((2, 4))})


def test_signature_must_match_the_artifact(model: Path, tmp_path: Path) -> None:
    fp16 = two_io_onnx(tmp_path / "fp16_io.onnx", image_type=TensorProto.FLOAT16)
    with pytest.raises(PipelineError, match="input 'image' is TYPE_FP32 but the ONNX model fp16_io.onnx says TYPE_FP16"):
        model_config_from_artifact(Artifact("fp16", "onnx", fp16), name="digits_fp16", signature=signature_from_onnx(model), max_batch=8)


def test_check_against_onnx_names_the_first_mismatch(model: Path) -> None:
    good = build(model)
    check_config_against_onnx(good, model)
    for mutate, message in [
        (lambda c: c.input[0].dims.__setitem__(2, 3), r"input 'image' has dims \[-1, 8, 8, 3\]"),
        (lambda c: setattr(c.output[0], "data_type", mc.TYPE_FP16), "output 'probs' is TYPE_FP16"),
        (lambda c: setattr(c.output[1], "name", "total"), "has output 'total' but the ONNX model"),
        (lambda c: c.input.pop(), "lacks input 'ids'"),
    ]:
        cfg = mc.ModelConfig()
        cfg.CopyFrom(good)
        mutate(cfg)
        with pytest.raises(PipelineError, match=message):
            check_config_against_onnx(cfg, model)


def qdq_conv_onnx(path: Path) -> Path:
    """float x → Q/DQ → Conv(DQ(int8 per-channel weights)) → Q/DQ: the INT8 variant's pattern."""
    rng = np.random.default_rng(1)
    weights = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    scale = (np.abs(weights).reshape(4, -1).max(1) / 127).astype(np.float32)
    quantized = np.clip(np.round(weights / scale[:, None, None, None]), -127, 127).astype(np.int8)
    inits = [
        numpy_helper.from_array(quantized, "w_q"), numpy_helper.from_array(scale, "w_s"), numpy_helper.from_array(np.zeros(4, np.int8), "w_z"),
        numpy_helper.from_array(np.array(1 / 127, np.float32), "x_s"), numpy_helper.from_array(np.array(0, np.int8), "x_z"),
        numpy_helper.from_array(np.array(0.05, np.float32), "y_s"), numpy_helper.from_array(np.array(0, np.int8), "y_z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["y", "y_s", "y_z"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "y_s", "y_z"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4, 8, 8])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def optimized_ops(model: Path, level: str, out: Path) -> list[str]:
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return [node.op_type for node in onnx.load(str(out)).graph.node]


def test_qdq_model_is_served_with_qdq_semantics(tmp_path: Path) -> None:
    """The INT8 config's graph level, mapped the way Triton's onnxruntime backend maps it, keeps the
    explicit Q/DQ math in real ONNX Runtime; the default level fuses it into integer kernels."""
    path = qdq_conv_onnx(tmp_path / "qdq.onnx")
    cfg = model_config_from_artifact(Artifact("int8", "onnx", path), name="m_int8", signature=signature_from_onnx(path), max_batch=8)
    assert cfg.optimization.graph.level == 2
    assert "graph {\n    level: 2\n  }" in config_text(cfg)
    level = ort_graph_level_name(cfg)
    assert level == "ORT_DISABLE_ALL"
    served = optimized_ops(path, level, tmp_path / "served.onnx")
    assert "Conv" in served and "DequantizeLinear" in served
    assert not {"QLinearConv", "ConvInteger", "MatMulInteger"} & set(served)
    assert "QLinearConv" in optimized_ops(path, "ORT_ENABLE_ALL", tmp_path / "default.onnx")


def test_cpu_int8_model_gets_cpu_instances_and_the_default_graph_level(tmp_path: Path) -> None:
    """The CPU INT8 variant is made for ONNX Runtime's integer kernels: its config leaves the graph level at
    ORT's default (the Q/DQ pattern becomes QLinearConv) and asks for CPU instances, also on a GPU server."""
    path = qdq_conv_onnx(tmp_path / "qdq.onnx")
    artifact = Artifact("int8cpu", "onnx", path)
    assert artifact.cpu_only and artifact.triton_name("digits") == "digits_int8cpu"
    assert parse_variant("digits_int8cpu") == ("digits", "int8cpu") and parse_variant("digits_int8") == ("digits", "int8")
    cfg = model_config_from_artifact(artifact, name="m_int8cpu", signature=signature_from_onnx(path), max_batch=8)
    assert not cfg.HasField("optimization") and ort_graph_level_name(cfg) == "ORT_ENABLE_ALL"
    assert [g.kind for g in cfg.instance_group] == [mc.ModelInstanceGroup.Kind.KIND_CPU]
    assert "QLinearConv" in optimized_ops(path, ort_graph_level_name(cfg), tmp_path / "served.onnx")


def engine_metadata(**overrides: object) -> dict[str, object]:
    """Engine metadata as the engine stage writes it (by hand: TensorRT cannot run on this machine)."""
    meta: dict[str, object] = {
        "tensorrt_version": "10.8.0",
        "inputs": [{"name": "image", "dtype": "DataType.FLOAT", "shape": [-1, 8, 8, 1]}, {"name": "ids", "dtype": "INT64", "shape": [-1, -1]}],
        "outputs": [{"name": "probs", "dtype": "float32", "shape": [-1, 10]}, {"name": "count", "dtype": "int64", "shape": [-1]}],
        "profiles": [{"image": {"min": [1, 8, 8, 1], "opt": [8, 8, 8, 1], "max": [32, 8, 8, 1]}, "ids": {"min": [1, 1], "opt": [8, 4], "max": [32, 16]}}],
    }
    meta.update(overrides)
    return meta


def plan(tmp_path: Path, meta: dict[str, object]) -> Artifact:
    (tmp_path / "model.plan").write_bytes(b"serialized engine (not real: no TensorRT here)")
    (tmp_path / "model.plan.json").write_text(json.dumps(meta))
    return Artifact("fp16", "plan", tmp_path / "model.plan", tmp_path / "model.plan.json")


def test_plan_config_is_checked_against_engine_metadata(model: Path, tmp_path: Path) -> None:
    """TensorRT cannot run here (no GPU): the engine metadata JSON is written by hand."""
    signature = signature_from_onnx(model)
    cfg = model_config_from_artifact(plan(tmp_path, engine_metadata()), name="digits_fp16_trt", signature=signature, max_batch=16, warmup=warmup_data())
    assert (cfg.platform, cfg.backend, cfg.default_model_filename) == ("tensorrt_plan", "tensorrt", "model.plan")
    assert [g.kind for g in cfg.instance_group] == [mc.ModelInstanceGroup.KIND_GPU]
    assert not cfg.HasField("optimization")

    with pytest.raises(PipelineError, match=r"max batch 64 of config 'digits_fp16_trt' is outside profile 0 .*admits batch 1..32"):
        model_config_from_artifact(plan(tmp_path, engine_metadata()), name="digits_fp16_trt", signature=signature, max_batch=64)
    with pytest.raises(PipelineError, match="cannot run with KIND_CPU"):
        model_config_from_artifact(plan(tmp_path, engine_metadata()), name="x", signature=signature, max_batch=16, kind="KIND_CPU")
    with pytest.raises(PipelineError, match=r"warmup 'real_sample_batch_1' \('ids' \[1, 20\], .*\) is outside every profile the config names \(0\)"):
        model_config_from_artifact(plan(tmp_path, engine_metadata()), name="x", signature=signature, max_batch=16, warmup={**warmup_data(), "ids": np.zeros((1, 20), np.int64)})


def test_a_plan_with_two_profiles_serves_both(model: Path, tmp_path: Path) -> None:
    """Every profile is named in instance_group (else Triton serves profile 0 only); a warmup shape
    that only the second profile admits is accepted, one that no profile admits is not.
    TensorRT cannot run here (no GPU): the engine metadata JSON is written by hand."""
    first = {"image": {"min": [1, 8, 8, 1], "opt": [8, 8, 8, 1], "max": [16, 8, 8, 1]}, "ids": {"min": [1, 1], "opt": [8, 4], "max": [16, 16]}}
    second = {"image": {"min": [1, 8, 8, 1], "opt": [8, 8, 8, 1], "max": [16, 8, 8, 1]}, "ids": {"min": [1, 16], "opt": [8, 32], "max": [16, 64]}}
    meta = engine_metadata(profiles=[first, second])
    signature = signature_from_onnx(model)
    cfg = model_config_from_artifact(plan(tmp_path, meta), name="x", signature=signature, max_batch=16,
                                     warmup={**warmup_data(), "ids": np.zeros((1, 40), np.int64)})
    assert [list(g.profile) for g in cfg.instance_group] == [["0", "1"]]
    assert 'profile: "0"' in config_text(cfg) and 'profile: "1"' in config_text(cfg)
    with pytest.raises(PipelineError, match=r"outside every profile the config names \(0, 1\)"):
        model_config_from_artifact(plan(tmp_path, meta), name="x", signature=signature, max_batch=16,
                                   warmup={**warmup_data(), "ids": np.zeros((1, 80), np.int64)})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"inputs": [{"name": "image", "dtype": "HALF", "shape": [-1, 8, 8, 1]}, {"name": "ids", "dtype": "INT64", "shape": [-1, -1]}]}, "input 'image' is TYPE_FP32 but the engine metadata .*model.plan.json says TYPE_FP16"),
        ({"inputs": [{"name": "image", "dtype": "FLOAT", "shape": [-1, 8, 8, 3]}, {"name": "ids", "dtype": "INT64", "shape": [-1, -1]}]}, r"input 'image' has dims \[-1, 8, 8, 1\] .* engine metadata .* has \[-1, 8, 8, 3\]"),
        ({"inputs": [{"name": "image", "dtype": "FLOAT", "shape": [8, 8, 8, 1]}, {"name": "ids", "dtype": "INT64", "shape": [8, -1]}]}, r"input 'image' has dims \[-1, 8, 8, 1\] .* engine metadata .* has \[8, 8, 8, 1\]"),
        ({"outputs": [{"name": "probs", "dtype": "float32", "shape": [-1, 10]}]}, "has output 'count' but the engine metadata .* has no such output \\(it has: probs\\)"),
        ({"profiles": []}, "lists no optimization profiles"),
        ({"profiles": [{"image": {"min": [1, 8, 8, 1], "max": [32, 8, 8, 1]}}]}, "profile 0 has no min/max shapes for input 'ids'"),
        ({"inputs": "image"}, "has no 'inputs' list"),
    ],
)
def test_engine_mismatch_fails_clearly(model: Path, tmp_path: Path, change: dict[str, object], message: str) -> None:
    """TensorRT cannot run here (no GPU): each engine metadata JSON is written by hand."""
    with pytest.raises(PipelineError, match=message):
        model_config_from_artifact(plan(tmp_path, engine_metadata(**change)), name="digits_fp16_trt", signature=signature_from_onnx(model), max_batch=16)


def test_engine_metadata_file_errors(model: Path, tmp_path: Path) -> None:
    cfg = model_config_from_artifact(plan(tmp_path, engine_metadata()), name="m", signature=signature_from_onnx(model), max_batch=16)
    check_config_against_engine(cfg, tmp_path / "model.plan.json")
    with pytest.raises(PipelineError, match="does not exist"):
        check_config_against_engine(cfg, tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PipelineError, match="is not valid JSON"):
        check_config_against_engine(cfg, tmp_path / "bad.json")
    with pytest.raises(PipelineError, match="has no engine metadata"):
        model_config_from_artifact(Artifact("fp16", "plan", tmp_path / "model.plan"), name="m", signature=signature_from_onnx(model), max_batch=16)


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [("DataType.FLOAT", "TYPE_FP32"), ("float16", "TYPE_FP16"), ("HALF", "TYPE_FP16"), ("INT64", "TYPE_INT64"), ("bool", "TYPE_BOOL"),
     ("TYPE_INT8", "TYPE_INT8"), ("trt.int32", "TYPE_INT32"), (np.dtype("uint8"), "TYPE_UINT8")],
)
def test_dtype_spellings(spelling: str, expected: str) -> None:
    assert triton_dtype(spelling) == expected


def test_unknown_dtype_is_a_user_error() -> None:
    with pytest.raises(PipelineError, match="unknown tensor data type 'quaternion'"):
        triton_dtype("quaternion")
    with pytest.raises(PipelineError, match="Triton has no data type for numpy 'complex64'"):
        triton_dtype(np.dtype("complex64"))


def test_parse_config_rejects_bad_text() -> None:
    with pytest.raises(PipelineError, match="is not a valid Triton model config"):
        parse_config('name: "x"\nmax_batch_size: "eight"\n')


def _accelerators(cfg: mc.ModelConfig) -> dict[str, dict[str, str]]:
    return {a.name: dict(a.parameters) for a in cfg.optimization.execution_accelerators.gpu_execution_accelerator}


@pytest.mark.parametrize(("precision", "mode"), [("fp32", "FP32"), ("fp16", "FP16")])
def test_gpu_instances_get_tensorrt_with_the_variants_precision_and_cuda_without_tf32(model: Path, precision: str, mode: str) -> None:
    """Keys as Triton's onnxruntime backend parses them (src/onnxruntime.cc); checked against the real
    ModelConfig protobuf by a text round trip. The ``ids`` input has a dynamic sequence axis, so no
    TensorRT profile is written (TensorRT sizes it from the traffic)."""
    cfg = model_config_from_artifact(Artifact(precision, "onnx", model), name=f"digits_{precision}", signature=signature_from_onnx(model),
                                     max_batch=8, preferred_batch_sizes=[4])
    assert _accelerators(cfg) == {
        "tensorrt": {"precision_mode": mode, "max_workspace_size_bytes": str(1 << 30), "trt_engine_cache_enable": "1",
                     "trt_engine_cache_path": f"/tmp/trt-engine-cache-digits_{precision}"},
        "cuda": {"use_tf32": "0"},
    }
    text = config_text(cfg)
    assert 'gpu_execution_accelerator {\n      name: "tensorrt"' in text
    assert parse_config(text) == cfg
    assert [g.kind for g in cfg.instance_group] == [mc.ModelInstanceGroup.KIND_AUTO]


def test_int8_gets_tensorrt_int8_from_the_qdq_graph_and_a_batch_profile(tmp_path: Path) -> None:
    """Fixed per-sample dims: the TensorRT profile spans batch 1..max (optimum at the largest preferred
    size), so a growing batch never rebuilds the engine; INT8 keeps every ORT graph optimization off."""
    path = qdq_conv_onnx(tmp_path / "qdq.onnx")
    signature = signature_from_onnx(path)
    cfg = model_config_from_artifact(Artifact("int8", "onnx", path), name="m_int8", signature=signature, max_batch=16,
                                     preferred_batch_sizes=[4, 8])
    trt = _accelerators(cfg)["tensorrt"]
    assert trt["precision_mode"] == "INT8" and "int8_calibration_table_name" not in trt  # a table would fail a Q/DQ model
    rest = "x".join(str(d) for d in signature.inputs[0].shape[1:])
    name = signature.inputs[0].name
    assert (trt["trt_profile_min_shapes"], trt["trt_profile_opt_shapes"], trt["trt_profile_max_shapes"]) == (
        f"{name}:1x{rest}", f"{name}:8x{rest}", f"{name}:16x{rest}")
    assert cfg.optimization.graph.level == 2
    assert parse_config(config_text(cfg)) == cfg


def test_tune_candidates_refit_the_tensorrt_profile(tmp_path: Path) -> None:
    from pipeline.tune.space import Candidate, config_for_candidate

    path = qdq_conv_onnx(tmp_path / "qdq.onnx")
    cfg = model_config_from_artifact(Artifact("int8", "onnx", path), name="m_int8", signature=signature_from_onnx(path), max_batch=16)
    name = signature_from_onnx(path).inputs[0].name
    tuned = config_for_candidate(cfg, Candidate(instance_count=2, max_batch_size=32, preferred_batch_sizes=(16,), max_queue_delay_us=0))
    trt = _accelerators(tuned)["tensorrt"]
    assert [trt[f"trt_profile_{k}_shapes"].split(":")[1].split("x")[0] for k in ("min", "opt", "max")] == ["1", "16", "32"]
    assert trt["trt_profile_max_shapes"].startswith(f"{name}:32x")
    assert _accelerators(cfg)["tensorrt"]["trt_profile_max_shapes"].startswith(f"{name}:16x")  # the base is untouched


def test_cpu_instances_and_plans_get_no_gpu_accelerator(model: Path) -> None:
    cpu = build(model, kind="KIND_CPU")
    assert not cpu.optimization.execution_accelerators.gpu_execution_accelerator
    assert "execution_accelerators" not in config_text(cpu)
