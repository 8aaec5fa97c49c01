"""Search space: defaults from the model, overrides, limits, and configs made from candidates."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.core.errors import PipelineError
from pipeline.tune.space import (
    Candidate,
    candidate_from_config,
    config_for_candidate,
    config_from_json,
    config_json,
    preferred_sizes,
    rule_of,
    search_space,
)

PUBLISHED = Candidate(1, 64, (32, 64), 100)


def published_config() -> mc.ModelConfig:
    """Shaped like the build's digits_fp32 config: KIND_AUTO instances, dynamic batching, warmup per batch size."""
    cfg = mc.ModelConfig(name="digits_fp32", platform="onnxruntime_onnx", max_batch_size=64)
    cfg.input.add(name="image", data_type=mc.TYPE_FP32, dims=[8, 8, 1])
    cfg.output.add(name="probs", data_type=mc.TYPE_FP32, dims=[10], label_filename="labels.txt")
    cfg.instance_group.add(count=1)
    cfg.dynamic_batching.preferred_batch_size.extend([32, 64])
    cfg.dynamic_batching.max_queue_delay_microseconds = 100
    for batch in (1, 32, 64):
        entry = cfg.model_warmup.add(name=f"real_sample_batch_{batch}", batch_size=batch)
        entry.inputs["image"].data_type = mc.TYPE_FP32
        entry.inputs["image"].dims.extend([8, 8, 1])
        entry.inputs["image"].input_data_file = "image.bin"
    return cfg


def test_preferred_rules_resolve_per_max_batch_and_back() -> None:
    assert preferred_sizes("none", 64) == ()
    assert preferred_sizes("max", 16) == (16,)
    assert preferred_sizes("half+max", 64) == (32, 64)
    assert preferred_sizes("8+16+128", 64) == (8, 16)
    assert rule_of((32, 64), 64) == "half+max"
    assert rule_of((), 64) == "none"
    assert rule_of((4, 8), 64) == "4+8"
    with pytest.raises(PipelineError, match="neither none, max, half\\+max nor sizes"):
        preferred_sizes("fast", 8)


def test_default_space_comes_from_the_published_config() -> None:
    space = search_space(PUBLISHED, None)
    assert space.instances == (1, 2, 4)
    assert space.max_batch == (8, 16, 32, 64)
    assert space.preferred == ("none", "half+max")
    assert space.queue_delay_us == (0, 100, 1000)
    assert space.candidate(space.index_of(PUBLISHED)) == PUBLISHED
    assert space.size == 3 * 4 * 2 * 3


def test_overrides_always_keep_the_published_value() -> None:
    space = search_space(PUBLISHED, None, instances="2,3", max_batch="16", preferred="max", queue_delay_us="0")
    assert space.instances == (1, 2, 3)
    assert space.max_batch == (16, 64)
    assert space.preferred == ("max", "half+max")
    assert space.queue_delay_us == (0, 100)


def test_max_batch_above_the_engine_profile_is_refused() -> None:
    with pytest.raises(PipelineError, match="--max-batch 64 is above what digits_fp32_trt admits \\(batch ≤ 32"):
        search_space(Candidate(1, 32, (16, 32), 100), 32, max_batch="16,64", model="digits_fp32_trt")


def test_defaults_stop_at_the_model_limit() -> None:
    assert search_space(Candidate(1, 32, (16, 32), 100), 32).max_batch == (8, 16, 32)


@pytest.mark.parametrize("option", ["instances", "queue_delay_us", "max_batch"])
def test_an_empty_or_bad_list_is_one_error(option: str) -> None:
    with pytest.raises(PipelineError, match="is not a comma-separated list of integers"):
        search_space(PUBLISHED, None, **{option: ","})


def test_a_model_without_batching_only_tunes_instances() -> None:
    space = search_space(Candidate(1, 0, (), 0), None)
    assert space.max_batch == (0,) and space.size == 3
    with pytest.raises(PipelineError, match="published with max_batch_size 0"):
        search_space(Candidate(1, 0, (), 0), None, max_batch="8")


def test_config_for_candidate_sets_every_knob_and_remakes_warmup() -> None:
    base = published_config()
    wanted = Candidate(4, 16, (16,), 0)
    cfg = config_for_candidate(base, wanted)
    assert candidate_from_config(cfg) == wanted
    assert [(w.name, w.batch_size) for w in cfg.model_warmup] == [("real_sample_batch_1", 1), ("real_sample_batch_16", 16)]
    assert cfg.model_warmup[1].inputs["image"].input_data_file == "image.bin"
    assert cfg.output[0].label_filename == "labels.txt" and list(cfg.input[0].dims) == [8, 8, 1]
    assert candidate_from_config(base) == PUBLISHED  # the base is not modified


def test_config_json_round_trips_as_the_load_override() -> None:
    import json

    cfg = config_for_candidate(published_config(), Candidate(2, 32, (), 1000))
    assert config_from_json(json.loads(config_json(cfg))) == cfg
