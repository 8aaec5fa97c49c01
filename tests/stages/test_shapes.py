"""Optimization profiles from --shape specs: parsing, defaults, several profiles, every error."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.data.profiles import ShapeProfile, format_shape_spec, profiles_from_json, profiles_to_json
from pipeline.data.tensors import ModelSignature, TensorSpec, signature_from_onnx
from pipeline.stages.shapes import SeenBucket, batch_axis, data_range, profiles_from_args, seen_in_files, calibration_hints

F32 = np.dtype("float32")
IMAGE = TensorSpec("image", F32, ("batch", 8, 8, 1))
PROBS = TensorSpec("probs", F32, ("batch", 10))
DIGITS = ModelSignature(inputs=(IMAGE,), outputs=(PROBS,))
TOKENS = TensorSpec("tokens", np.dtype("int64"), ("batch", "seq"))
SCALE = TensorSpec("scale", F32, (1,))
TWO_INPUTS = ModelSignature(inputs=(IMAGE, TOKENS, SCALE), outputs=(PROBS,))


def error(specs: list[str], signature: ModelSignature = DIGITS, max_batch: int = 64) -> PipelineError:
    with pytest.raises(PipelineError) as info:
        profiles_from_args(specs, signature, max_batch=max_batch)
    message = str(info.value)
    assert "\n" not in message and info.value.fix, message
    return info.value


def test_no_specs_gives_the_default_profile() -> None:
    profiles = profiles_from_args([], DIGITS, max_batch=64)
    assert profiles == [ShapeProfile({"image": ((1, 8, 8, 1), (64, 8, 8, 1), (64, 8, 8, 1))})]


def test_spec_sets_min_opt_max() -> None:
    profiles = profiles_from_args(["image:1x8x8x1/16x8x8x1/32x8x8x1"], DIGITS, max_batch=64)
    assert profiles == [ShapeProfile({"image": ((1, 8, 8, 1), (16, 8, 8, 1), (32, 8, 8, 1))})]


def test_repeating_an_input_starts_the_next_profile() -> None:
    specs = ["image:1x8x8x1/1x8x8x1/8x8x8x1", "image:8x8x8x1/64x8x8x1/64x8x8x1"]
    profiles = profiles_from_args(specs, DIGITS, max_batch=64)
    assert [p.shapes["image"] for p in profiles] == [
        ((1, 8, 8, 1), (1, 8, 8, 1), (8, 8, 8, 1)),
        ((8, 8, 8, 1), (64, 8, 8, 1), (64, 8, 8, 1)),
    ]


def test_every_profile_covers_every_dynamic_input(caplog: pytest.LogCaptureFixture) -> None:
    specs = ["tokens:1x16/4x32/8x64", "image:2x8x8x1/4x8x8x1/8x8x8x1", "tokens:1x1/2x2/4x4"]
    with caplog.at_level(logging.WARNING, logger="pipeline.stages.shapes"):
        profiles = profiles_from_args(specs, TWO_INPUTS, max_batch=8, dynamic_default=32)
    assert len(profiles) == 2
    assert profiles[0].shapes == {
        "image": ((2, 8, 8, 1), (4, 8, 8, 1), (8, 8, 8, 1)),
        "tokens": ((1, 16), (4, 32), (8, 64)),
    }
    # Profile 2 names only tokens: image gets the batch range tokens was given (inputs share it).
    assert profiles[1].shapes == {
        "image": ((1, 8, 8, 1), (2, 8, 8, 1), (4, 8, 8, 1)),
        "tokens": ((1, 1), (2, 2), (4, 4)),
    }
    assert "scale" not in profiles[0].shapes  # static: needs no profile
    assert not caplog.records  # every non-batch dynamic axis was given


def test_default_batch_without_any_given_batch_is_1_max_max() -> None:
    profiles = profiles_from_args(["scale:1/1/1"], TWO_INPUTS, max_batch=8, dynamic_default=4)
    assert profiles[0].shapes["image"] == ((1, 8, 8, 1), (8, 8, 8, 1), (8, 8, 8, 1))
    assert profiles[0].shapes["tokens"] == ((1, 1), (8, 4), (8, 4))


def test_default_for_non_batch_dynamic_axis_warns_to_pass_shape(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pipeline.stages.shapes"):
        profiles = profiles_from_args([], TWO_INPUTS, max_batch=16, dynamic_default=128)
    assert profiles[0].shapes["tokens"] == ((1, 1), (16, 128), (16, 128))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "'tokens' axis 1 ('seq')" in warnings[0] and "pass --shape tokens:1x1/16x128/16x128" in warnings[0]


def test_static_input_spec_is_checked_but_needs_no_profile() -> None:
    profiles = profiles_from_args(["scale:1/1/1"], TWO_INPUTS, max_batch=4)
    assert set(profiles[0].shapes) == {"image", "tokens"}
    assert "axis 0 of input 'scale' is fixed at 1 in the model, got 2 in MAX" in str(
        error(["scale:1/1/2"], TWO_INPUTS)
    )


def test_batch_axis_is_the_one_named_batch_else_dynamic_axis_0() -> None:
    assert batch_axis(IMAGE) == 0
    assert batch_axis(TensorSpec("x", F32, ("time", "batch", 4))) == 1
    assert batch_axis(TensorSpec("x", F32, ("n", 4))) == 0
    assert batch_axis(TensorSpec("x", F32, (1, "seq"))) is None
    time_major = ModelSignature(inputs=(TensorSpec("x", F32, ("time", "batch", 4)),), outputs=())
    assert profiles_from_args([], time_major, max_batch=8, dynamic_default=20)[0].shapes["x"] == (
        (1, 1, 4), (20, 8, 4), (20, 8, 4),
    )


def test_input_names_with_colons_parse() -> None:
    sig = ModelSignature(inputs=(TensorSpec("input_1:0", F32, ("batch", 3)),), outputs=())
    assert profiles_from_args(["input_1:0:1x3/2x3/4x3"], sig, max_batch=4)[0].shapes == {
        "input_1:0": ((1, 3), (2, 3), (4, 3))
    }


@pytest.mark.parametrize(
    "spec",
    ["image", "image:1x8x8x1/16x8x8x1", "image:1x8x8x1/16x8x8x1/32x8x8x1/64x8x8x1", "image:1x8xax1/1x8x8x1/1x8x8x1",
     ":1x8x8x1/1x8x8x1/1x8x8x1", "image:1x8x8x1//1x8x8x1", "image:1,8,8,1/1,8,8,1/1,8,8,1"],
)
def test_malformed_spec_shows_syntax_and_example(spec: str) -> None:
    err = error([spec])
    assert f"malformed --shape '{spec}'" in err.problem and "INPUT:MIN/OPT/MAX" in err.problem
    assert err.fix == "write --shape INPUT:MIN/OPT/MAX with dims joined by 'x', e.g. --shape image:1x8x8x1/64x8x8x1/64x8x8x1"


def test_unknown_input() -> None:
    err = error(["label:1/2/3"])
    assert err.problem == "--shape 'label:1/2/3' names input 'label', but the model's inputs are: image"
    assert err.fix == "use one of: image"


def test_wrong_rank() -> None:
    err = error(["image:1x8x8x1/2x8x8/4x8x8x1"])
    assert "OPT has 3 dims but input 'image' has rank 4 (batchx8x8x1)" in err.problem


def test_fixed_dim_names_axis_expected_and_got() -> None:
    err = error(["image:1x8x8x1/16x9x8x1/32x8x8x1"])
    assert "axis 1 of input 'image' is fixed at 8 in the model, got 9 in OPT" in err.problem
    assert err.fix == "use 8 for axis 1 in MIN, OPT and MAX"


def test_min_opt_max_order_names_axis() -> None:
    err = error(["image:4x8x8x1/2x8x8x1/8x8x8x1"])
    assert "axis 0 needs MIN <= OPT <= MAX, got 4/2/8" in err.problem


@pytest.mark.parametrize("spec, level, value", [
    ("image:0x8x8x1/2x8x8x1/8x8x8x1", "MIN", 0),
    ("image:1x8x8x1/2x8x8x1/-8x8x8x1", "MAX", -8),
])
def test_non_positive_dims(spec: str, level: str, value: int) -> None:
    assert f"axis 0 of {level} is {value}; every dim must be at least 1" in error([spec]).problem


def test_max_batch_above_max_batch_option() -> None:
    err = error(["image:1x8x8x1/16x8x8x1/128x8x8x1"], max_batch=64)
    assert "MAX batch (axis 0) is 128, above --max-batch 64" in err.problem
    assert "raise --max-batch" in str(err.fix)


def test_bad_max_batch_and_dynamic_default() -> None:
    assert "--max-batch must be at least 1, got 0" in error([], max_batch=0).problem
    with pytest.raises(PipelineError, match="default size of dynamic axes must be at least 1"):
        profiles_from_args([], DIGITS, max_batch=4, dynamic_default=0)


def test_json_round_trip_and_format() -> None:
    profiles = profiles_from_args(["tokens:1x16/4x32/8x64", "tokens:1x1/2x2/4x4"], TWO_INPUTS, max_batch=8)
    data = profiles_to_json(profiles)
    assert data[0]["tokens"] == {"min": [1, 16], "opt": [4, 32], "max": [8, 64]}
    assert profiles_from_json(data) == profiles
    assert format_shape_spec("tokens", profiles[1].shapes["tokens"]) == "tokens:1x1/2x2/4x4"


@pytest.mark.parametrize("data", [{}, [1], [{"x": {"min": [1]}}], [{"x": {"min": [1], "opt": ["a"], "max": [1]}}]])
def test_json_in_another_form_is_a_pipeline_error(data: object) -> None:
    with pytest.raises(PipelineError, match="rebuild the engine"):
        profiles_from_json(data)


def test_profiles_from_a_real_onnx_signature(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["image"], ["probs"])],
        "g",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 8, 8, 1])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 8, 8, 1])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), str(path))
    profiles = profiles_from_args(["image:1x8x8x1/4x8x8x1/4x8x8x1"], signature_from_onnx(path), max_batch=4)
    assert str(profiles[0]) == "image:1x8x8x1/4x8x8x1/4x8x8x1"


# ----------------------------------------------------------------------------- sized from the data

SEQ = ModelSignature(inputs=(TOKENS,), outputs=(PROBS,))


def seen(*buckets: tuple[int, int]) -> list[SeenBucket]:
    """Token buckets of (sequence length, samples)."""
    return [SeenBucket(f"calib.npz[{length}]", {"tokens": (length,)}, n) for length, n in buckets]


def test_dynamic_axis_is_sized_from_the_data(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pipeline.stages.shapes"):
        profiles = profiles_from_args([], SEQ, max_batch=64, seen=seen((16, 300), (20, 212)))
    # OPT the most common length, MIN the power of two <= 16, MAX the power of two > 20
    assert profiles == [ShapeProfile({"tokens": ((1, 16), (64, 16), (64, 32))})]
    messages = [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("sizes seen in the data 16 (300 samples), 20 (212 samples) → MIN 16, OPT 16, MAX 32" in m for m in messages)
    assert any(m.endswith("the same profiles: --shape tokens:1x16/64x16/64x32") for m in messages)


@pytest.mark.parametrize("counts, expected", [
    ({16: 1}, (16, 16, 32)),
    ({20: 5, 12: 5}, (8, 20, 32)),        # a tie takes the larger size
    ({3: 1, 100: 2, 7: 9}, (2, 7, 128)),
    ({1: 4}, (1, 1, 2)),
    ({224: 10, 192: 3}, (128, 224, 256)),
])
def test_data_range_rule(counts: dict[int, int], expected: tuple[int, int, int]) -> None:
    assert data_range(counts) == expected


def test_the_logged_shape_reproduces_the_profile() -> None:
    derived = profiles_from_args([], TWO_INPUTS, max_batch=8, seen=seen((16, 3), (40, 1)))
    again = profiles_from_args([format_shape_spec(n, r) for n, r in derived[0].shapes.items()], TWO_INPUTS, max_batch=8, seen=seen((16, 3), (40, 1)))
    assert derived == again
    assert derived[0].shapes["tokens"] == ((1, 16), (8, 16), (8, 64))


def test_shape_overrides_the_data_when_it_covers_it() -> None:
    profiles = profiles_from_args(["tokens:1x8/4x20/8x24"], SEQ, max_batch=8, seen=seen((16, 3), (20, 1)))
    assert profiles[0].shapes["tokens"] == ((1, 8), (4, 20), (8, 24))


def test_shape_that_does_not_cover_the_data_is_one_line_naming_a_shape_that_does() -> None:
    with pytest.raises(PipelineError, match=r"--shape does not cover the data calib.npz\[20\]: input 'tokens' has size 20 on axis 1, outside the profile: 1..16") as info:
        profiles_from_args(["tokens:1x1/8x16/8x16"], SEQ, max_batch=8, seen=seen((16, 3), (20, 1)))
    assert info.value.fix == "widen --shape to cover the data, e.g. --shape tokens:1x16/8x16/8x32, or leave --shape out to size the profiles from the data"
    assert "\n" not in str(info.value)


def test_data_fits_when_any_profile_covers_it() -> None:
    specs = ["tokens:1x1/8x16/8x16", "tokens:1x17/8x20/8x20"]
    assert len(profiles_from_args(specs, SEQ, max_batch=8, seen=seen((16, 3), (20, 1)))) == 2
    with pytest.raises(PipelineError, match=r"size 40 on axis 1, outside every profile \(profile 0: 1..16\)"):
        profiles_from_args(specs, SEQ, max_batch=8, seen=seen((16, 3), (40, 1)))


def test_data_of_other_inputs_or_static_axes_does_not_size_anything() -> None:
    other = [SeenBucket("x", {"image": (8, 8, 1), "scale": ()}, 10)]
    profiles = profiles_from_args([], TWO_INPUTS, max_batch=8, dynamic_default=32, seen=other)
    assert profiles[0].shapes["tokens"] == ((1, 1), (8, 32), (8, 32))


def test_seen_in_files_reads_buckets_from_headers(tmp_path: Path) -> None:
    np.savez(tmp_path / "calib.npz", **{"tokens__16": np.zeros((30, 16), np.int64), "tokens__20": np.zeros((10, 20), np.int64)})
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "tokens__8.npy", np.zeros((5, 8), np.int64))
    np.save(tmp_path / "npy" / "tokens__12.npy", np.zeros((7, 12), np.int64))
    (tmp_path / "images").mkdir()
    assert [(b.shapes, b.samples) for b in seen_in_files(tmp_path, SEQ)] == [({"tokens": (16,)}, 30), ({"tokens": (20,)}, 10)]
    assert sorted((b.origin.endswith("[8]"), b.shapes["tokens"], b.samples) for b in seen_in_files(tmp_path / "npy", SEQ)) == [
        (False, (12,), 7), (True, (8,), 5)
    ]
    assert seen_in_files(tmp_path / "images", SEQ) == []


def test_calibration_hints_are_the_opt_shapes_without_logging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pipeline.stages.shapes"):
        hints = calibration_hints(["image:1x8x8x1/4x8x8x1/4x8x8x1"], TWO_INPUTS, max_batch=4)
    assert hints == {"image": (8, 8, 1), "tokens": (64,)}
    assert not caplog.records


@pytest.mark.slow
def test_build_sizes_a_sequence_axis_from_its_own_data(tmp_path: Path) -> None:
    """A token model with calibration and evaluation data of lengths 12 and 20 builds INT8 without
    --shape; a --shape that misses length 20 is one line and publishes nothing."""
    from tests.conftest import cli, one_line_error

    rng = np.random.default_rng(0)
    folder = tmp_path / "calibration" / "tok"
    folder.mkdir(parents=True)
    np.savez(folder / "calib.npz", tokens__12=rng.integers(1, 100, (90, 12)).astype(np.int32), tokens__20=rng.integers(1, 100, (40, 20)).astype(np.int32))
    np.savez(folder / "eval.npz", tokens__12=rng.integers(1, 100, (300, 12)).astype(np.int32), labels__12=np.zeros(300, np.int64),
             tokens__20=rng.integers(1, 100, (100, 20)).astype(np.int32), labels__20=np.zeros(100, np.int64))
    common = ["build", "--model", "tests.keras_models:tokens", "--name", "tok", "--int8", "--workdir", str(tmp_path / "build"),
              "--repository", str(tmp_path / "repo"), "--calibration-root", str(tmp_path / "calibration"), "--int8-max-drop", "100"]
    line = one_line_error(cli(*common, "--shape", "tokens:1x1/8x12/8x16"))
    assert "--shape does not cover the data" in line and "has size 20 on axis 1" in line and "--shape tokens:1x8/64x12/64x32" in line
    assert not (tmp_path / "repo").exists()

    proc = cli(*common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = " ".join(proc.stderr.split())
    assert "sizes seen in the data 12 (390 samples), 20 (140 samples) → MIN 8, OPT 12, MAX 32" in log
    assert "the same profiles: --shape tokens:1x8/64x12/64x32" in log
    from pipeline.triton.config import parse_config

    config = parse_config((tmp_path / "repo" / "tok_int8" / "config.pbtxt").read_text())
    assert [list(i.dims) for i in config.input] == [[-1]]
    assert [list(i.dims) for w in config.model_warmup for i in w.inputs.values()][0] == [12]  # a real sample of the common length
