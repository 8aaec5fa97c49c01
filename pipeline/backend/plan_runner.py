"""Running a TensorRT plan on batches of any size and shape its profiles admit.

TensorRT rejects an input shape outside the active optimization profile, and Polygraphy's TrtRunner
stays on profile 0 unless ``set_profile`` is called (polygraphy/backend/trt/runner.py, 0.53.6). A multi-profile
engine evaluated as-is would run every batch in profile 0, and a batch larger than the profile's MAX
batch would fail. :class:`ProfiledRunner` picks, for every batch, the first profile that admits all
its input shapes, and :func:`plan_max_batch` is the largest batch every profile admits (the
evaluation batch is capped to it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polygraphy.backend.base import BaseRunner

from pipeline.backend.trt_seam import TensorRT
from pipeline.core.errors import PipelineError
from pipeline.data.profiles import Shape, ShapeProfile, profiles_from_json


def profile_for(profiles: Sequence[ShapeProfile], shapes: Mapping[str, Shape]) -> int | None:
    """The index of the first profile whose (min, max) admits every input shape it names; None if none does.

    A model without dynamic inputs has no profiles (or empty ones): profile 0."""
    if not any(p.shapes for p in profiles):
        return 0
    for index, profile in enumerate(profiles):
        if all(_within(shapes.get(name), lo, hi) for name, (lo, _, hi) in profile.shapes.items()):
            return index
    return None


def _within(shape: Shape | None, lo: Shape, hi: Shape) -> bool:
    return shape is not None and len(shape) == len(lo) and all(a <= d <= b for d, a, b in zip(shape, lo, hi))


def plan_max_batch(profiles: Sequence[ShapeProfile]) -> int | None:
    """The largest batch (axis 0) every profile admits for every input; None without dynamic inputs."""
    highs = [hi[0] for p in profiles for (_, _, hi) in p.shapes.values() if hi]
    return min(highs) if highs else None


def plan_profiles(metadata: Mapping[str, Any]) -> list[ShapeProfile]:
    """The profiles a plan's metadata JSON records (read back from the engine at build time)."""
    return profiles_from_json(metadata.get("profiles", []))


class ProfiledRunner(BaseRunner):  # type: ignore[misc]  # Polygraphy is untyped
    """A plan runner that switches to the profile admitting each batch before running it."""

    def __init__(self, inner: BaseRunner, profiles: Sequence[ShapeProfile], plan_path: Path, name: str | None = None) -> None:
        super().__init__(name=name or inner.name)
        self._inner = inner
        self._profiles = list(profiles)
        self._plan = plan_path
        self._active: int | None = None

    def activate_impl(self) -> None:
        self._inner.activate()
        self._active = 0  # TensorRT's and Polygraphy's default

    def get_input_metadata_impl(self) -> Any:
        return self._inner.get_input_metadata(use_numpy_dtypes=False)

    def infer_impl(self, feed_dict: Mapping[str, Any]) -> Any:
        shapes = {name: tuple(int(d) for d in value.shape) for name, value in feed_dict.items()}
        index = profile_for(self._profiles, shapes)
        if index is None:
            shown = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
            ranges = "; ".join(str(p) for p in self._profiles)
            raise PipelineError(
                f"a batch of shape {shown} fits no optimization profile of {self._plan} ({ranges})",
                # The gate's batch is capped to every profile's MAX batch (plan_max_batch), so what is left is a
                # profile's MIN above the bucket's last, partial batch, or a size outside every range: --shape decides.
                "rebuild the plan with --shape profiles that admit it (MIN batch 1, and ranges covering every size in "
                "the data)",
            )
        if index != self._active:
            self._inner.set_profile(index)
            self._active = index
        outputs = self._inner.infer(feed_dict)
        self.inference_time = self._inner.last_inference_time()
        return outputs

    def deactivate_impl(self) -> None:
        self._active = None
        self._inner.deactivate()


def runner_for_plan(plan_path: Path, metadata: Mapping[str, Any], *, tensorrt: TensorRT, allow_host_code: bool = False,
                    name: str | None = None) -> ProfiledRunner:
    """A runner over the plan at ``plan_path`` (its ``metadata`` JSON gives the profiles), through the ``tensorrt`` seam."""
    plan_path = Path(plan_path)
    if not plan_path.is_file():
        raise PipelineError(f"TensorRT plan {plan_path} does not exist", "build it first (python -m pipeline build)")
    inner = tensorrt.runner(plan_path, allow_host_code=allow_host_code, name=name)
    return ProfiledRunner(inner, plan_profiles(metadata), plan_path, name=name)
