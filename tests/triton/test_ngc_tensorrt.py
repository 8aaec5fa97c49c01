"""The TensorRT of the serving image: which NGC tags are offered for plans (only those whose TensorRT a source
gives), and ``build --triton-image`` refusing, before any stage, a TensorRT the image cannot load. TensorRT cannot
run here: the build's TensorRT is the stand-in of tests/trt_standin.py, given through ``BuildConfig.tensorrt``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.build import check_plans_load_in_image
from pipeline.build_cli import config_from_args, run_build
from pipeline.cli import make_parser
from pipeline.errors import PipelineError
from pipeline.triton.ngc_releases import RELEASES, check_plan_tensorrt, ngc_image, sourced_tensorrt
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
