"""Per-profile Triton configs built from the base ModelConfig protobuf."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig, ModelInstanceGroup

from pipeline.core.errors import PipelineError
from pipeline.mig.configs import (
    config_name,
    config_relpath,
    mig_configs_for_repository,
    profile_configs,
    write_profile_configs,
)
from pipeline.mig.layout import parse_layout
from pipeline.mig.memory import (
    MemoryEstimate,
    memory_from_engine_metadata,
    memory_from_onnx,
)
from pipeline.mig.plan import GIB, plan_instances
from pipeline.mig.profiles import builtin_gpu
from pipeline.triton.config import config_text, model_config_path, read_model_config
from pipeline.triton.repository import read_repository

H200 = builtin_gpu("H200-141GB")


def base_config(name: str = "tiny_fp32") -> ModelConfig:
    config = ModelConfig(name=name, platform="onnxruntime_onnx", max_batch_size=32)
    config.input.add(name="image", data_type=DataType.TYPE_FP32, dims=[16])
    config.output.add(name="probs", data_type=DataType.TYPE_FP32, dims=[10])
    config.instance_group.add(kind=ModelInstanceGroup.Kind.KIND_CPU, count=1)
    config.dynamic_batching.max_queue_delay_microseconds = 100
    return config


def test_profile_configs_have_their_own_gpu_instance_groups(tiny_onnx: Path) -> None:
    base = base_config()
    before = base.SerializeToString()
    plan = plan_instances(H200, {"tiny_fp32": memory_from_onnx(tiny_onnx, 32)}, parse_layout("3x2g.35gb,1x1g.18gb", H200))
    configs = profile_configs(base, plan)
    assert sorted(configs) == ["configs/1g.18gb.pbtxt", "configs/2g.35gb.pbtxt"]
    for relpath, config in configs.items():
        profile = relpath.removeprefix("configs/").removesuffix(".pbtxt")
        assert [(g.kind, g.count) for g in config.instance_group] == [
            (ModelInstanceGroup.Kind.KIND_GPU, plan.profile(profile).instances("tiny_fp32"))
        ]
        # everything else is the base config, and the text parses back to the same protobuf
        expected = ModelConfig()
        expected.CopyFrom(base)
        del expected.instance_group[:]
        expected.instance_group.extend(config.instance_group)
        assert config == expected
        assert text_format.Parse(config_text(config), ModelConfig()) == config
    assert configs["configs/2g.35gb.pbtxt"].instance_group[0].count == 4
    assert base.SerializeToString() == before  # the base is not modified


def test_config_names_keep_dots_and_plus_but_not_spaces() -> None:
    assert config_name("1g.18gb+me") == "1g.18gb+me"
    assert config_relpath("7g.141gb") == "configs/7g.141gb.pbtxt"
    with pytest.raises(PipelineError, match="contains a space"):
        config_name("1g 18gb")
    with pytest.raises(PipelineError, match="not a file name"):
        config_name("../x")


def test_excluded_profile_gets_no_config(tmp_path: Path) -> None:
    """Engine metadata written by hand (no TensorRT here): 20 GiB per instance."""
    meta = tmp_path / "big.json"
    meta.write_text(json.dumps({"device_memory_bytes": 20 * GIB, "weights_bytes": GIB}))
    plan, files = mig_configs_for_repository(
        {"big_fp16_trt": base_config("big_fp16_trt")}, "H200-141GB", "1x1g.18gb,1x3g.71gb",
        {"big_fp16_trt": memory_from_engine_metadata(meta)},
    )
    assert list(files["big_fp16_trt"]) == ["configs/3g.71gb.pbtxt"]
    parsed = text_format.Parse(files["big_fp16_trt"]["configs/3g.71gb.pbtxt"], ModelConfig())
    assert parsed.instance_group[0].count == plan.profile("3g.71gb").instances("big_fp16_trt") == 3
    assert plan.profile("1g.18gb").loaded == ()


def test_mig_configs_for_repository_errors(tiny_onnx: Path) -> None:
    with pytest.raises(PipelineError, match="no memory estimate for model\\(s\\) tiny_fp32"):
        mig_configs_for_repository({"tiny_fp32": base_config()}, "H200-141GB", None, {})
    huge = {"tiny_fp32": MemoryEstimate("test", 0, 200 * GIB)}
    with pytest.raises(PipelineError, match="no model fits any MIG profile"):
        mig_configs_for_repository({"tiny_fp32": base_config()}, "H200-141GB", None, huge)
    with pytest.raises(PipelineError, match="at most 2"):
        mig_configs_for_repository({"tiny_fp32": base_config()}, "H200-141GB", "3x3g.71gb",
                                   {"tiny_fp32": memory_from_onnx(tiny_onnx, 8)})


def test_read_and_write_repository_configs(tmp_path: Path, tiny_onnx: Path) -> None:
    model_dir = tmp_path / "repo" / "tiny_fp32"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes(tiny_onnx.read_bytes())
    (model_dir / "config.pbtxt").write_text(config_text(base_config()))
    models = read_repository(tmp_path / "repo")
    assert list(models) == ["tiny_fp32"] and models["tiny_fp32"].path == model_dir
    assert models["tiny_fp32"].config == base_config()
    written = write_profile_configs(model_dir, {"configs/1g.18gb.pbtxt": "name: \"tiny_fp32\"\nmax_batch_size: 2\n"})
    assert written == [model_dir / "configs" / "1g.18gb.pbtxt"] and written[0].is_file()
    # what Triton reads with --model-config-name: the custom config where present, else config.pbtxt
    assert model_config_path(model_dir, "1g.18gb") == written[0]
    assert model_config_path(model_dir, "2g.35gb") == model_dir / "config.pbtxt"
    assert read_model_config(model_dir, "1g.18gb").max_batch_size == 2
    assert read_model_config(model_dir) == base_config()
    with pytest.raises(PipelineError, match="has no config.pbtxt"):
        write_profile_configs(tmp_path, {"configs/1g.18gb.pbtxt": ""})
    (tmp_path / "bad" / "m" / "1").mkdir(parents=True)
    (tmp_path / "bad" / "m" / "config.pbtxt").write_text("instance_group [ { count: many } ]")
    with pytest.raises(PipelineError, match="m/config.pbtxt is not a valid Triton model config"):
        read_repository(tmp_path / "bad")
