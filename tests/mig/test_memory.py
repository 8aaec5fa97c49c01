"""Memory per model instance: ONNX weights + activations at max batch, and engine metadata."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.mig.memory import (
    INSTANCE_OVERHEAD_BYTES,
    activation_bytes,
    memory_for_model_dir,
    memory_from_engine_metadata,
    memory_from_onnx,
)
from pipeline.triton.accelerators import TRT_WORKSPACE_BYTES

TINY_WEIGHTS = (16 * 32 + 32 * 10) * 4


def tiny_activations(batch: int) -> int:
    # image [b,16] + hidden [b,32] + relu [b,32] + logits [b,10] + probs [b,10], float32
    return batch * (16 + 32 + 32 + 10 + 10) * 4


def test_onnx_estimate_of_tiny_model(tiny_onnx: Path) -> None:
    est = memory_from_onnx(tiny_onnx, 8)
    assert est.shared_bytes == 0  # ORT backend: one session, with its own weights, per instance
    assert est.per_instance_bytes == TINY_WEIGHTS + tiny_activations(8) + INSTANCE_OVERHEAD_BYTES
    assert est.bytes_for(3) == 3 * est.per_instance_bytes
    assert "batch 8" in est.source
    # activations scale with the batch, weights do not
    assert memory_from_onnx(tiny_onnx, 64).per_instance_bytes - est.per_instance_bytes == tiny_activations(56)


def test_data_dependent_shapes_are_measured_with_onnxruntime(tmp_path: Path) -> None:
    """NonZero's output size depends on the data; an all-ones sample gives the largest."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("idx", TensorProto.INT64, None)
    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["idx"])], "nz", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "nonzero.onnx"
    onnx.save(model, str(path))
    total, measured = activation_bytes(path, 3)
    assert measured == ["idx"]
    assert total == 3 * 4 * 4 + 2 * 12 * 8  # input + int64 [2, 12] indices


def test_dynamic_non_batch_axis_is_refused(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "seq.onnx"))
    with pytest.raises(PipelineError, match="dynamic axis 1 \\('seq'\\)"):
        memory_from_onnx(tmp_path / "seq.onnx", 4)
    with pytest.raises(PipelineError, match="not a batch size"):
        memory_from_onnx(tmp_path / "seq.onnx", 0)


def test_engine_metadata_weights_shared_device_memory_per_instance(tmp_path: Path) -> None:
    meta = tmp_path / "model.plan.json"
    meta.write_text(json.dumps({"tensorrt_version": "10.8", "device_memory_bytes": 5_000_000, "weights_bytes": 40_000_000}))
    est = memory_from_engine_metadata(meta)
    assert est.shared_bytes == 40_000_000
    assert est.per_instance_bytes == 5_000_000 + INSTANCE_OVERHEAD_BYTES
    assert est.bytes_for(2) == 40_000_000 + 2 * (5_000_000 + INSTANCE_OVERHEAD_BYTES)


def test_a_plan_with_two_profiles_holds_two_execution_contexts_per_instance(tmp_path: Path) -> None:
    """The config names every profile, and Triton's TensorRT backend creates one execution context (with its
    own device memory) per named profile: two profiles cost twice the device memory per instance."""
    profile = {"tokens": {"min": [1, 4], "opt": [8, 8], "max": [8, 16]}}
    meta = tmp_path / "model.plan.json"
    meta.write_text(json.dumps({"device_memory_bytes": 5_000_000, "weights_bytes": 40_000_000, "profiles": [profile, profile]}))
    est = memory_from_engine_metadata(meta)
    assert est.shared_bytes == 40_000_000
    assert est.per_instance_bytes == 2 * 5_000_000 + INSTANCE_OVERHEAD_BYTES
    assert "2 execution contexts (one per optimization profile)" in est.detail
    meta.write_text(json.dumps({"device_memory_bytes": 5_000_000, "weights_bytes": 40_000_000, "profiles": [profile]}))
    assert memory_from_engine_metadata(meta).per_instance_bytes == 5_000_000 + INSTANCE_OVERHEAD_BYTES


def test_engine_metadata_other_spellings_and_fallbacks(tmp_path: Path, tiny_onnx: Path) -> None:
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"memory": {"device_memory_size": 123, "weights_size": 456}}))
    assert (memory_from_engine_metadata(nested).shared_bytes, memory_from_engine_metadata(nested).per_instance_bytes) == (
        456, 123 + INSTANCE_OVERHEAD_BYTES)
    # weights missing: the serialized plan next to the JSON stands in for them
    (tmp_path / "model.plan").write_bytes(b"\0" * 1000)
    no_weights = tmp_path / "model.json"
    no_weights.write_text(json.dumps({"device_memory_bytes": 10}))
    est = memory_from_engine_metadata(no_weights)
    assert est.shared_bytes == 1000 and "model.plan" in est.detail
    # nothing usable: the ONNX model fills both numbers, or a clear error names the keys
    empty = tmp_path / "other" / "empty.json"
    empty.parent.mkdir()
    empty.write_text(json.dumps({"tensorrt_version": "10.8"}))
    with pytest.raises(PipelineError, match="no device memory \\(looked for device_memory_bytes"):
        memory_from_engine_metadata(empty)
    filled = memory_from_engine_metadata(empty, tiny_onnx, 8)
    assert (filled.shared_bytes, filled.per_instance_bytes) == (TINY_WEIGHTS, tiny_activations(8) + INSTANCE_OVERHEAD_BYTES)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(PipelineError, match="cannot read engine metadata"):
        memory_from_engine_metadata(broken)


def test_memory_for_model_dirs(tmp_path: Path, tiny_onnx: Path) -> None:
    onnx_dir = tmp_path / "tiny_fp32" / "1"
    onnx_dir.mkdir(parents=True)
    (onnx_dir / "model.onnx").write_bytes(tiny_onnx.read_bytes())
    assert memory_for_model_dir(tmp_path / "tiny_fp32", 8).per_instance_bytes == (
        TINY_WEIGHTS + tiny_activations(8) + INSTANCE_OVERHEAD_BYTES)
    plan_dir = tmp_path / "tiny_fp16_trt" / "1"
    plan_dir.mkdir(parents=True)
    (plan_dir / "model.plan").write_bytes(np.zeros(10, np.uint8).tobytes())
    with pytest.raises(PipelineError, match="no engine metadata"):
        memory_for_model_dir(tmp_path / "tiny_fp16_trt", 8)
    (plan_dir / "model.plan.json").write_text(json.dumps({"device_memory_bytes": 7, "weights_bytes": 9}))
    assert memory_for_model_dir(tmp_path / "tiny_fp16_trt", 8).shared_bytes == 9


def test_memory_from_published_repository_report(tmp_path: Path) -> None:
    """What the build publishes: model.plan plus .pipeline-report.json holding the engine stage's
    metadata (device_memory_bytes, plan, plan_bytes; no weights key). Hand-written: no TensorRT here."""
    model_dir = tmp_path / "digits_int8_trt"
    for version, device in (("1", 111), ("2", 5_000_000)):
        (model_dir / version).mkdir(parents=True)
        (model_dir / version / "model.plan").write_bytes(b"\0" * 4096)
    metadata = {"format": 1, "plan": "digits_int8.plan", "plan_bytes": 4096, "device_memory_bytes": 5_000_000}
    report = {"model": "digits_int8_trt", "versions": {
        "1": {"engine_metadata": {**metadata, "device_memory_bytes": 111}},
        "2": {"engine_metadata": metadata},
    }}
    (model_dir / ".pipeline-report.json").write_text(json.dumps(report))
    est = memory_for_model_dir(model_dir, 8)  # the latest version, 2
    assert (est.shared_bytes, est.per_instance_bytes) == (4096, 5_000_000 + INSTANCE_OVERHEAD_BYTES)
    assert "model.plan" in est.detail
    # without the plan file the recorded plan_bytes stand in for the weights
    from pipeline.mig.memory import memory_from_metadata

    alone = memory_from_metadata({**metadata, "plan_bytes": 2048}, "test")
    assert alone.shared_bytes == 2048 and "plan_bytes" in alone.detail


def test_memory_for_build_artifacts(tmp_path: Path, tiny_onnx: Path) -> None:
    """The build's Artifact objects; the plan and its metadata are hand-written (no TensorRT here)."""
    from pipeline.data.artifacts import Artifact
    from pipeline.mig.memory import memory_for_artifact

    onnx_est = memory_for_artifact(Artifact("fp32", "onnx", tiny_onnx), 8)
    # a GPU variant: its config runs ONNX Runtime's TensorRT EP, so each instance also holds an engine and the workspace
    assert onnx_est.per_instance_bytes == 2 * TINY_WEIGHTS + tiny_activations(8) + INSTANCE_OVERHEAD_BYTES + TRT_WORKSPACE_BYTES
    assert "pipeline.triton.accelerators.TRT_WORKSPACE_BYTES" in onnx_est.detail
    cpu_est = memory_for_artifact(Artifact("int8cpu", "onnx", tiny_onnx), 8)
    assert cpu_est.per_instance_bytes == TINY_WEIGHTS + tiny_activations(8) + INSTANCE_OVERHEAD_BYTES
    plan = tmp_path / "digits_int8.plan"
    plan.write_bytes(b"\0" * 3000)
    meta = tmp_path / "digits_int8.plan.json"
    meta.write_text(json.dumps({"plan": "digits_int8.plan", "plan_bytes": 3000, "device_memory_bytes": 2_000_000}))
    plan_est = memory_for_artifact(Artifact("int8", "plan", plan, metadata=meta), 8)
    assert (plan_est.shared_bytes, plan_est.per_instance_bytes) == (3000, 2_000_000 + INSTANCE_OVERHEAD_BYTES)
    with pytest.raises(PipelineError, match="no engine metadata JSON"):
        memory_for_artifact(Artifact("int8", "plan", plan), 8)


def test_a_published_onnx_model_counts_the_workspace_its_config_gives_tensorrt(tmp_path: Path, tiny_onnx: Path) -> None:
    """The workspace comes from the model's real config.pbtxt (written by the config generator), and the
    estimate says so; a config without the tensorrt accelerator (CPU instances) adds nothing."""
    from pipeline.data.artifacts import Artifact
    from pipeline.data.tensors import signature_from_onnx
    from pipeline.triton.config import config_text, model_config_from_artifact

    model_dir = tmp_path / "tiny_fp32"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes(tiny_onnx.read_bytes())
    cfg = model_config_from_artifact(Artifact("fp32", "onnx", tiny_onnx), name="tiny_fp32", signature=signature_from_onnx(tiny_onnx), max_batch=8)
    trt = next(a for a in cfg.optimization.execution_accelerators.gpu_execution_accelerator if a.name == "tensorrt")
    trt.parameters["max_workspace_size_bytes"] = str(256 << 20)  # as a MIG profile's config may lower it
    (model_dir / "config.pbtxt").write_text(config_text(cfg))
    est = memory_for_model_dir(model_dir, 8)
    assert est.per_instance_bytes == 2 * TINY_WEIGHTS + tiny_activations(8) + INSTANCE_OVERHEAD_BYTES + (256 << 20)
    assert "tiny_fp32/config.pbtxt" in est.detail and "with TensorRT" in est.source
    cpu = model_config_from_artifact(Artifact("fp32", "onnx", tiny_onnx), name="tiny_fp32", signature=signature_from_onnx(tiny_onnx),
                                     max_batch=8, kind="KIND_CPU")
    (model_dir / "config.pbtxt").write_text(config_text(cpu))
    assert memory_for_model_dir(model_dir, 8).per_instance_bytes == TINY_WEIGHTS + tiny_activations(8) + INSTANCE_OVERHEAD_BYTES
