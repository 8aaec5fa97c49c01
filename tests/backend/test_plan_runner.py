"""Plans run in the optimization profile that admits each batch, in batches their profiles admit.

TensorRT cannot run here: the plans are the stand-in's (tests/trt_standin.py), whose runner refuses a
shape outside the active profile as TensorRT does, so a wrong profile choice fails these tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.backend.plan_runner import plan_max_batch, profile_for, runner_for_plan
from pipeline.core.errors import PipelineError
from pipeline.data.artifacts import Artifact
from pipeline.data.profiles import ShapeProfile
from pipeline.stages.accuracy import gate_batch
from pipeline.stages.engine import EngineSettings, engine_from_onnx, metadata_path, read_engine_metadata
from tests.stages.test_engine import tiny_onnx
from tests.trt_standin import StandInRefused, StandInTensorRT

SMALL = ShapeProfile({"image": ((1, 8, 8, 1), (2, 8, 8, 1), (2, 8, 8, 1))})
LARGE = ShapeProfile({"image": ((3, 8, 8, 1), (6, 8, 8, 1), (6, 8, 8, 1))})


def _plan(tmp_path: Path, standin: StandInTensorRT) -> Artifact:
    onnx_path = tiny_onnx(tmp_path / "m.onnx")
    return engine_from_onnx(onnx_path, tmp_path / "m.plan", settings=EngineSettings("fp32", (SMALL, LARGE)), timing_cache=tmp_path / "tc",
                            tensorrt=standin)


def test_profile_choice_and_max_batch() -> None:
    assert profile_for([SMALL, LARGE], {"image": (2, 8, 8, 1)}) == 0
    assert profile_for([SMALL, LARGE], {"image": (5, 8, 8, 1)}) == 1
    assert profile_for([SMALL, LARGE], {"image": (7, 8, 8, 1)}) is None
    assert profile_for([], {"image": (7, 8, 8, 1)}) == 0  # static model
    assert plan_max_batch([SMALL, LARGE]) == 2 and plan_max_batch([LARGE]) == 6 and plan_max_batch([]) is None


def test_each_batch_runs_in_the_profile_that_admits_it(tmp_path: Path) -> None:
    standin = StandInTensorRT()
    plan = _plan(tmp_path, standin)
    rng = np.random.default_rng(0)
    with runner_for_plan(plan.path, read_engine_metadata(metadata_path(plan.path)), tensorrt=standin) as runner:
        for batch in (1, 5, 2, 3):
            x = rng.standard_normal((batch, 8, 8, 1)).astype(np.float32)
            np.testing.assert_array_equal(runner.infer({"image": x})["probs"], np.maximum(x, 0))
        with pytest.raises(PipelineError, match=r"a batch of shape image \[7, 8, 8, 1\] fits no optimization profile of .*m.plan") as caught:
            runner.infer({"image": np.zeros((7, 8, 8, 1), np.float32)})
        assert caught.value.fix and "--shape" in caught.value.fix and "smaller batch" not in caught.value.fix  # no option sets it
    assert standin.runners[0].profile_log == [0, 1, 0, 1]


def test_the_stand_in_refuses_a_shape_outside_the_active_profile(tmp_path: Path) -> None:
    """What the profile choice prevents: TensorRT refuses a batch outside the profile it runs in."""
    standin = StandInTensorRT()
    plan = _plan(tmp_path, standin)
    with standin.runner(plan.path, allow_host_code=False) as raw, pytest.raises(StandInRefused, match="outside optimization profile 0"):
        raw.infer({"image": np.zeros((5, 8, 8, 1), np.float32)})


def test_the_gate_batch_is_capped_to_what_every_profile_admits(tmp_path: Path) -> None:
    plan = _plan(tmp_path, StandInTensorRT())
    assert gate_batch([plan], 64) == 2
    assert gate_batch([Artifact("fp16", "onnx", tmp_path / "m.onnx")], 64) == 64
