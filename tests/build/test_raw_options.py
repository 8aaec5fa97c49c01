"""The raw-input options are checked before any work, each refusal one line naming the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.build.config import BuildConfig
from pipeline.core.errors import PipelineError
from pipeline.core.objectstore import S3Url
from pipeline.data.tensors import TensorSpec
from pipeline.stages.image_preprocess import image_preprocess_for


@pytest.mark.parametrize("options, problem", [
    ({"raw_variant": "fp16"}, "--raw-variant only applies with --raw-inputs"),
    ({"raw_inputs": "image", "raw_variant": "int8"}, "--raw-variant int8 is not among the variants this build makes"),
    ({"raw_inputs": "image", "extensions_library": Path("/no/such/libortextensions.so")}, "--extensions-library .* does not exist"),
    ({"raw_inputs": "text", "extensions_library": Path("/x.so")}, "only applies to --raw-inputs image"),
    ({"resize_filter": "pil-bilinear"}, "--resize-filter only applies with --raw-inputs"),
    ({"raw_inputs": "text", "resize_filter": "pil-bilinear"}, "--resize-filter pil-bilinear only applies to --raw-inputs image"),
    ({"raw_inputs": "image", "repository": S3Url("bucket", "repo")}, "a server reading s3:// cannot load"),
])
def test_raw_options_refused_before_any_work(options: dict, problem: str) -> None:
    with pytest.raises(PipelineError, match=problem):
        BuildConfig(**options).validate()


def test_raw_variant_that_is_built_is_accepted() -> None:
    BuildConfig(raw_inputs="image", raw_variant="fp16", fp16=True).validate()


@pytest.mark.parametrize("spec, problem", [
    (TensorSpec("ids", np.dtype("int32"), ("batch", 16)), "takes int32"),
    (TensorSpec("x", np.dtype("float32"), ("batch", 16)), "does not look like an image"),
    (TensorSpec("image", np.dtype("float32"), ("batch", None, None, 3)), "dynamic image size"),
])
def test_inputs_that_are_not_fixed_size_float_images(spec: TensorSpec, problem: str) -> None:
    with pytest.raises(PipelineError, match=problem) as caught:
        image_preprocess_for(spec, None, "unit", None)
    assert caught.value.problem.startswith("--raw-inputs image") and "\n" not in caught.value.problem
