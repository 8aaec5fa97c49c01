"""Dynamic-shape optimization profiles for TensorRT, from ``--shape`` options and the model.

A TensorRT engine built from a model with dynamic axes needs, for every dynamic input, the
smallest (MIN), the tuned-for (OPT) and the largest (MAX) shape it will be run with. One set of
those for all dynamic inputs is an *optimization profile*; an engine may hold several.

``--shape INPUT:MIN/OPT/MAX`` gives one input's range, dims joined by ``x``::

    --shape image:1x8x8x1/64x8x8x1/64x8x8x1

Naming an input a second time starts the next profile; inputs a profile does not name get the
defaults below, so every profile covers every dynamic input.

Inputs without dynamic axes need no profile: a ``--shape`` for one is checked against the model
and otherwise ignored.

Defaults (when an input is not named):

* batch axis (the axis the ONNX graph names ``batch``, else axis 0 if dynamic): MIN 1, OPT ``max_batch``,
  MAX ``max_batch``. OPT is the largest batch because that is the batch Triton's dynamic batcher
  forms when the server is busy, which is when kernel choice decides throughput; at low load
  batches are small and latency is dominated by launch overhead, not by the tuned tactic. Add a
  second profile with a small OPT if single-request latency matters more. If another input of
  the same profile was given, its batch range is used instead (inputs share the batch).
* any other dynamic axis (e.g. a sequence length, an image side), when real data was seen
  (calibration and evaluation samples, see :class:`SeenShapes`), is sized from that data:

  - OPT = the most common size seen (by samples; the larger one on a tie): what the engine's
    kernels are tuned for is what the data says is typical;
  - MIN = the largest power of two <= the smallest size seen;
  - MAX = the smallest power of two > the largest size seen.

  So every size seen fits, sizes a little outside the data (a sentence a few tokens longer, a
  slightly smaller image) fit too, and the range stays within 2x of the data on each side.
  The profile is logged with the exact ``--shape`` options that reproduce it.
* a dynamic non-batch axis without any real data: MIN 1, OPT and MAX ``dynamic_default``.
  The model says nothing about its range, so a warning asks for ``--shape``.

``--shape`` overrides all of this for the inputs it names; real data a profile given by
``--shape`` cannot run (a sample of a size outside every profile) is an error naming the sample
size and a ``--shape`` that covers it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.data.profiles import SHAPE_SYNTAX, Shape, ShapeProfile, ShapeRange, format_shape_spec, well_formed
from pipeline.data.tensors import ModelSignature, TensorSpec

log = logging.getLogger(__name__)

DEFAULT_DYNAMIC_DIM = 64
_LEVELS = ("MIN", "OPT", "MAX")


@dataclass(frozen=True)
class SeenBucket:
    """Real samples of one size: where they came from, each input's per-sample shape (no
    batch axis), and how many samples there are."""

    origin: str
    shapes: Mapping[str, Shape]
    samples: int


SeenShapes = Sequence[SeenBucket]


def seen_shapes(buckets: Iterable[tuple[str, Mapping[str, Shape], int]]) -> list[SeenBucket]:
    """:class:`SeenBucket` list from ``(origin, {input: per-sample shape}, samples)`` tuples
    (what :meth:`pipeline.accuracy.evaldata.EvalData.sample_shapes` returns)."""
    return [SeenBucket(origin, {k: tuple(int(d) for d in v) for k, v in shapes.items()}, int(n)) for origin, shapes, n in buckets]


def batch_axis(spec: TensorSpec) -> int | None:
    """The input's dynamic batch axis: the one the ONNX graph names ``batch``, else axis 0 if dynamic."""
    named = [axis for axis, dim in enumerate(spec.shape) if dim == "batch"]
    if named:
        return named[0]
    return 0 if 0 in spec.dynamic_axes else None


def default_range(
    spec: TensorSpec,
    *,
    max_batch: int,
    dynamic_default: int = DEFAULT_DYNAMIC_DIM,
    batch_range: tuple[int, int, int] | None = None,
    sizes: Mapping[int, Mapping[int, int]] | None = None,
) -> ShapeRange:
    """The range an input gets when ``--shape`` does not name it (see the module docstring).

    ``batch_range`` is the batch (min, opt, max) another input of the same profile was given:
    inputs share the batch, so the default follows it instead of 1/max_batch/max_batch.
    ``sizes`` maps a dynamic non-batch axis to the sizes real data has there (size → samples).
    """
    mins, opts, maxs = [], [], []
    batch = batch_axis(spec)
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int) and dim >= 0:
            lo = opt = hi = dim
        elif axis == batch:
            lo, opt, hi = batch_range or (1, max_batch, max_batch)
        elif sizes and sizes.get(axis):
            lo, opt, hi = data_range(sizes[axis])
        else:
            lo, opt, hi = 1, dynamic_default, dynamic_default
        mins.append(lo)
        opts.append(opt)
        maxs.append(hi)
    return tuple(mins), tuple(opts), tuple(maxs)


def data_range(counts: Mapping[int, int]) -> tuple[int, int, int]:
    """(MIN, OPT, MAX) of one axis from the sizes seen there (size → samples): OPT the most
    common size (the larger on a tie), MIN the largest power of two <= the smallest size, MAX the
    smallest power of two > the largest size."""
    opt = max(counts, key=lambda size: (counts[size], size))
    lo = 1 << (max(min(counts), 1).bit_length() - 1)
    hi = 1 << max(max(counts), 1).bit_length()
    return lo, opt, hi


def sizes_by_axis(spec: TensorSpec, seen: SeenShapes) -> dict[int, Counter[int]]:
    """For each dynamic non-batch axis of ``spec``: the sizes the real data has there → samples.
    Data arrays hold one sample per row, so model axis ``a`` is per-sample dim ``a - 1``."""
    batch = batch_axis(spec)
    axes = [a for a in spec.dynamic_axes if a not in (0, batch)]
    counts: dict[int, Counter[int]] = {}
    for bucket in seen:
        shape = bucket.shapes.get(spec.name)
        if shape is None or len(shape) != len(spec.shape) - 1:
            continue
        for axis in axes:
            counts.setdefault(axis, Counter())[shape[axis - 1]] += bucket.samples
    return counts


def profiles_from_args(
    specs: Sequence[str],
    signature: ModelSignature,
    *,
    max_batch: int,
    dynamic_default: int = DEFAULT_DYNAMIC_DIM,
    seen: SeenShapes = (),
    quiet: bool = False,
) -> list[ShapeProfile]:
    """Turn ``--shape`` texts into optimization profiles covering every dynamic input.

    Repeating an input name starts the next profile. With no specs, one default profile, its
    non-batch dynamic axes sized from ``seen`` (the real calibration/evaluation samples) where
    there are any. Every problem, including ``--shape`` profiles that cannot run the ``seen``
    samples, raises one :class:`PipelineError` naming the spec and the fix. ``quiet``: no log
    lines and no coverage check (for a provisional look before the data is read).
    """
    if max_batch < 1:
        raise PipelineError(f"--max-batch must be at least 1, got {max_batch}", "pass e.g. --max-batch 64")
    if dynamic_default < 1:
        raise PipelineError(
            f"the default size of dynamic axes must be at least 1, got {dynamic_default}",
            "pass a positive value",
        )
    dynamic = [s for s in signature.inputs if s.dynamic_axes]
    groups: list[dict[str, ShapeRange]] = [{}]
    for text in specs:
        name, shape_range = _parse_spec(text, signature, max_batch=max_batch)
        if name in groups[-1]:
            groups.append({})
        groups[-1][name] = shape_range

    sizes = {spec.name: sizes_by_axis(spec, seen) for spec in dynamic}
    profiles = []
    warned: set[tuple[str, int]] = set()
    from_data = False
    for given in groups:
        batch_range = _given_batch_range(given, signature)
        shapes: dict[str, ShapeRange] = {}
        for spec in dynamic:
            if spec.name in given:
                shapes[spec.name] = given[spec.name]
                continue
            shapes[spec.name] = default_range(
                spec, max_batch=max_batch, dynamic_default=dynamic_default, batch_range=batch_range, sizes=sizes[spec.name]
            )
            if not quiet:
                from_data |= _log_sized_axes(spec, shapes[spec.name], sizes[spec.name], warned)
        profiles.append(ShapeProfile(shapes))
    if quiet:
        return profiles
    for index, profile in enumerate(profiles):
        log.info("optimization profile %d: %s", index, str(profile) or "(model has no dynamic inputs)")
    if from_data:
        log.info("profiles sized from the data; the same profiles: %s", " ".join(f"--shape {format_shape_spec(n, r)}" for p in profiles for n, r in p.shapes.items()))
    _check_covers(profiles, signature, seen, max_batch=max_batch, dynamic_default=dynamic_default)
    return profiles


def _check_covers(profiles: Sequence[ShapeProfile], signature: ModelSignature, seen: SeenShapes, *, max_batch: int, dynamic_default: int) -> None:
    """Every real sample must fit one profile (its non-batch dims within MIN..MAX of every input)."""
    for bucket in seen:
        misses = [_miss(profile, signature, bucket) for profile in profiles]
        if not all(misses):
            continue
        name, axis, size, lo, hi = misses[0]  # type: ignore[misc]
        derived = {
            spec.name: default_range(spec, max_batch=max_batch, dynamic_default=dynamic_default, sizes=sizes_by_axis(spec, seen))
            for spec in signature.inputs if spec.dynamic_axes
        }
        cover = " ".join(f"--shape {format_shape_spec(n, r)}" for n, r in derived.items())
        where = "the profile" if len(profiles) == 1 else "every profile (profile 0"
        raise PipelineError(
            f"--shape does not cover the data {bucket.origin}: input '{name}' has size {size} on axis {axis}, "
            f"outside {where}: {lo}..{hi}{')' if len(profiles) > 1 else ''}",
            f"widen --shape to cover the data, e.g. {cover}, or leave --shape out to size the profiles from the data",
        )


def _miss(profile: ShapeProfile, signature: ModelSignature, bucket: SeenBucket) -> tuple[str, int, int, int, int] | None:
    """The first (input, axis, size, min, max) of ``bucket`` outside ``profile``; None if it fits."""
    for name, (lo, _, hi) in profile.shapes.items():
        shape = bucket.shapes.get(name)
        spec = signature.input(name)
        if shape is None or len(shape) != len(spec.shape) - 1:
            continue
        for axis in spec.dynamic_axes:
            if axis in (0, batch_axis(spec)):
                continue
            if not lo[axis] <= shape[axis - 1] <= hi[axis]:
                return name, axis, shape[axis - 1], lo[axis], hi[axis]
    return None


def _given_batch_range(given: Mapping[str, ShapeRange], signature: ModelSignature) -> tuple[int, int, int] | None:
    for name, (lo, opt, hi) in given.items():
        axis = batch_axis(signature.input(name))
        if axis is not None:
            return lo[axis], opt[axis], hi[axis]
    return None


def _log_sized_axes(
    spec: TensorSpec, shape_range: ShapeRange, sizes: Mapping[int, Mapping[int, int]], warned: set[tuple[str, int]]
) -> bool:
    """Say where each non-batch dynamic axis got its range; True if any came from the data."""
    from_data = False
    for axis, dim in enumerate(spec.shape):
        if axis not in spec.dynamic_axes or axis == batch_axis(spec) or (spec.name, axis) in warned:
            continue
        warned.add((spec.name, axis))
        lo, opt, hi = (shape[axis] for shape in shape_range)
        if sizes.get(axis):
            from_data = True
            seen = ", ".join(f"{size} ({n} samples)" for size, n in sorted(sizes[axis].items()))
            log.info("input '%s' axis %d ('%s'): sizes seen in the data %s → MIN %d, OPT %d, MAX %d", spec.name, axis, dim, seen, lo, opt, hi)
            continue
        log.warning(
            "input '%s' axis %d ('%s') is dynamic and neither data nor --shape gives its range; using %d/%d/%d — "
            "pass --shape %s with the sizes you serve",
            spec.name, axis, dim, lo, opt, hi, format_shape_spec(spec.name, shape_range),
        )
    return from_data


def _syntax_fix(signature: ModelSignature, max_batch: int) -> str:
    example = "image:1x8x8x1/64x8x8x1/64x8x8x1"
    if signature.inputs:
        first = signature.inputs[0]
        example = format_shape_spec(first.name, default_range(first, max_batch=max_batch))
    return f"write --shape {SHAPE_SYNTAX}, e.g. --shape {example}"


def _parse_spec(text: str, signature: ModelSignature, *, max_batch: int) -> tuple[str, ShapeRange]:
    if not well_formed(text):
        raise PipelineError(f"malformed --shape '{text}': expected {SHAPE_SYNTAX}", _syntax_fix(signature, max_batch))
    name, _, ranges = text.rpartition(":")
    levels = ranges.split("/")
    names = [s.name for s in signature.inputs]
    if name not in names:
        raise PipelineError(
            f"--shape '{text}' names input '{name}', but the model's inputs are: {', '.join(names) or '(none)'}",
            f"use one of: {', '.join(names)}",
        )
    spec = signature.input(name)
    lo, opt, hi = (tuple(int(d) for d in level.split("x")) for level in levels)
    shape_range = (lo, opt, hi)
    _check_range(text, spec, shape_range, max_batch=max_batch)
    return name, shape_range


def _check_range(text: str, spec: TensorSpec, shape_range: ShapeRange, *, max_batch: int) -> None:
    model_dims = "x".join(str(d) for d in spec.shape)
    for level, shape in zip(_LEVELS, shape_range):
        if len(shape) != len(spec.shape):
            raise PipelineError(
                f"--shape '{text}': {level} has {len(shape)} dims but input '{spec.name}' has rank "
                f"{len(spec.shape)} ({model_dims})",
                f"give {len(spec.shape)} dims joined by 'x' for each of MIN, OPT and MAX",
            )
        for axis, size in enumerate(shape):
            if size < 1:
                raise PipelineError(
                    f"--shape '{text}': axis {axis} of {level} is {size}; every dim must be at least 1",
                    f"use a positive size for axis {axis}",
                )
    for axis, dim in enumerate(spec.shape):
        lo, opt, hi = (shape[axis] for shape in shape_range)
        if axis not in spec.dynamic_axes:
            if (lo, opt, hi) != (dim, dim, dim):
                got = next(f"{size} in {lvl}" for lvl, size in zip(_LEVELS, (lo, opt, hi)) if size != dim)
                raise PipelineError(
                    f"--shape '{text}': axis {axis} of input '{spec.name}' is fixed at {dim} in the model, got {got}",
                    f"use {dim} for axis {axis} in MIN, OPT and MAX",
                )
            continue
        if not lo <= opt <= hi:
            raise PipelineError(
                f"--shape '{text}': axis {axis} needs MIN <= OPT <= MAX, got {lo}/{opt}/{hi}",
                f"order the sizes of axis {axis} as MIN <= OPT <= MAX",
            )
        if axis == batch_axis(spec) and hi > max_batch:
            raise PipelineError(
                f"--shape '{text}': MAX batch (axis {axis}) is {hi}, above --max-batch {max_batch}",
                f"lower MAX on axis {axis} to at most {max_batch}, or raise --max-batch",
            )


def seen_in_files(path: Path, signature: ModelSignature) -> list[SeenBucket]:
    """The sample shapes of array data at ``path`` (an ``.npz``, a folder holding ``calib.npz``,
    or a folder of ``.npy`` files), read from headers only; [] for anything else (e.g. images,
    which are resized to the profile instead)."""
    from pipeline.data.buckets import sample_shapes
    from pipeline.stages.calibration import CALIB_FILE

    path = Path(path)
    if path.is_dir() and (path / CALIB_FILE).is_file():
        path = path / CALIB_FILE
    if (path.is_file() and path.suffix == ".npz") or (path.is_dir() and any(path.glob("*.npy"))):
        return seen_shapes(sample_shapes(path, signature))
    return []


def calibration_hints(specs: Sequence[str], signature: ModelSignature, *, max_batch: int) -> dict[str, Shape]:
    """Per-sample OPT shapes (no batch axis) of the profile ``--shape`` (or the defaults) give
    before any data is read: the size image calibration resizes to when the model's H×W are
    dynamic. Array data never needs them (each array keeps its own size)."""
    profiles = profiles_from_args(specs, signature, max_batch=max_batch, quiet=True)
    return {name: r[1][1:] for name, r in profiles[0].shapes.items()} if profiles else {}
