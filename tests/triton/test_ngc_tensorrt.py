"""The TensorRT of the serving image: which NGC tags are offered for plans (only those whose TensorRT a source
gives), and ``build --triton-image`` refusing, before any stage, a TensorRT the image cannot load. TensorRT cannot
run here: the build's TensorRT is the stand-in of tests/trt_standin.py, given through ``BuildConfig.tensorrt``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.build.orchestrator import check_plans_load_in_image
from pipeline.cli import make_parser
from pipeline.commands.build import config_from_args, run_build
from pipeline.core.errors import PipelineError
from pipeline.triton.ngc_releases import (
    RELEASES,
    TENSORRT_UNSOURCED,
    ModelNeeds,
    NgcRelease,
    check_image,
    check_plan_tensorrt,
    ngc_image,
    sourced_tensorrt,
    tags_running_tensorrt,
)
from tests.trt_standin import StandInTensorRT


def test_a_bare_ngc_tag_names_the_ngc_image_and_anything_else_is_kept() -> None:
    assert ngc_image("24.10-py3") == "nvcr.io/nvidia/tritonserver:24.10-py3"
    digest = "nvcr.io/nvidia/tritonserver:25.03-py3@sha256:" + "ab" * 32
    assert ngc_image(digest) == digest and ngc_image("registry.example/triton:prod") == "registry.example/triton:prod"


def test_every_tag_is_offered_for_plans_only_with_a_sourced_tensorrt() -> None:
    """Every row either has a TensorRT a source gives, or is refused for plans with a message that says why."""
    for release in RELEASES:
        if sourced_tensorrt(release) is not None:
            check_plan_tensorrt(release.image, release.tensorrt or "")
            continue
        with pytest.raises(PipelineError) as caught:
            check_plan_tensorrt(release.image, "10.16.1.11")
        text = str(caught.value)
        assert "not known from a source" in text or "not verified" in text or "do not load" in text, release.tag
        assert f"nvcr.io/nvidia/tensorrt:{release.tag}-py3" in text, release.tag


def _sourced(tag: str, tensorrt: str) -> tuple[NgcRelease, ...]:
    """The release table with ``tag``'s TensorRT set as a source would give it (illustrative values, not claims):
    the table argument the checks take, not a stand-in for them."""
    return tuple(dataclasses.replace(r, tensorrt=tensorrt, unverified=(), unknown=()) if r.tag == tag else r for r in RELEASES)


def test_a_sourced_tag_is_offered_for_plans_of_its_tensorrt_and_refuses_another_naming_the_wheel_and_container() -> None:
    table = _sourced("25.03", "10.9.0.34")
    image = "nvcr.io/nvidia/tritonserver:25.03-py3"
    check_plan_tensorrt(image, "10.9.0.34", table)  # the same TensorRT: offered
    assert tags_running_tensorrt("10.9.0.34", table) == ["25.03"]
    with pytest.raises(PipelineError) as caught:
        check_plan_tensorrt(image, "11.4.0.106", table)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"plans built here with TensorRT 11.4.0.106 do not load in {image}, which runs TensorRT 10.9.0.34")
    assert "pip install 'tensorrt==10.9.0.34'" in text and "nvcr.io/nvidia/tensorrt:25.03-py3" in text
    assert "not verified" not in text
    # deploy: a plan of the row's TensorRT passes the image check, another is refused naming the tag that runs it
    assert check_image(image, [ModelNeeds("m", is_plan=True, plan_tensorrt="10.9.0.34")], table) == []
    with pytest.raises(PipelineError) as caught:
        check_image("nvcr.io/nvidia/tritonserver:25.04-py3", [ModelNeeds("m", is_plan=True, plan_tensorrt="10.9.0.34")], table)
    assert f"pass --image {image}, which runs TensorRT 10.9" in str(caught.value)


def test_a_sourced_tensorrt_below_the_engine_stages_minimum_is_refused_naming_the_way_out() -> None:
    """A row whose TensorRT is older than MIN_TENSORRT (10.8) is never offered: no plan of this pipeline is that old."""
    table = _sourced("24.10", "10.5.0.18")
    with pytest.raises(PipelineError) as caught:
        check_plan_tensorrt("nvcr.io/nvidia/tritonserver:24.10-py3", "11.4.0.106", table)
    text = str(caught.value)
    assert "\n" not in text and "which runs TensorRT 10.5.0.18" in text
    assert "TensorRT 10.5 is older than 10.8" in text and "nvcr.io/nvidia/tensorrt:24.10-py3" in text
    assert "pip install" not in text


def test_an_unsourced_tag_is_refused_saying_why() -> None:
    release = next(r for r in RELEASES if r.tag == "25.03")
    assert sourced_tensorrt(release) is None  # today: no source for it could be read (module docstring)
    with pytest.raises(PipelineError) as caught:
        check_plan_tensorrt(release.image, "10.9.0.34")
    text = str(caught.value)
    assert "\n" not in text and "is not known from a source" in text and TENSORRT_UNSOURCED in text
    assert "--plans-at-deploy (the deploy bundle builds them in nvcr.io/nvidia/tensorrt:25.03-py3)" in text
    assert tags_running_tensorrt("10.9.0.34") == [r.tag for r in RELEASES if sourced_tensorrt(r)]


def test_the_build_refuses_an_image_whose_tensorrt_differs_before_any_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``build --triton-image 24.10-py3`` with TensorRT 11.4 (the stand-in of tests/trt_standin.py: TensorRT cannot
    run here) refuses in one line, exit 2, before any stage: no workdir, no repository."""
    argv = ["build", "--triton-image", "24.10-py3", "--workdir", str(tmp_path / "build"), "--repository", str(tmp_path / "repo")]
    args = make_parser().parse_args(argv)
    args.argv = argv
    cfg = dataclasses.replace(config_from_args(args), tensorrt=StandInTensorRT(version="11.4.0.106"))
    with pytest.raises(PipelineError) as caught:
        run_build(cfg)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("plans built here with TensorRT 11.4.0.106 do not load in nvcr.io/nvidia/tritonserver:24.10-py3, "
                              "which runs TensorRT 10.5 (not verified)")
    assert "--plans-at-deploy (the deploy bundle builds them in nvcr.io/nvidia/tensorrt:24.10-py3)" in message and "--no-engine" in message
    assert not (tmp_path / "build").exists() and not (tmp_path / "repo").exists()
    # --no-engine: no plan is built, so nothing about TensorRT is refused (the build itself is not run here)
    cfg_no_engine = dataclasses.replace(cfg, engine=False)
    check_plans_load_in_image(cfg_no_engine)
    # TensorRT not installed (the stand-in reports no platform): no plan will be built, nothing to refuse
    check_plans_load_in_image(dataclasses.replace(cfg, tensorrt=_NoTensorRT()))


class _NoTensorRT:
    """A seam whose TensorRT is absent, as PolygraphyTensorRT reports it where the module is not installed."""

    def status(self) -> tuple[bool, str]:
        return False, "TensorRT is not installed"

    def platform(self) -> None:
        return None
