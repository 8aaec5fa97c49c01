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
* any other dynamic axis (e.g. a sequence length): MIN 1, OPT and MAX ``dynamic_default``.
  The model says nothing about its range, so a warning asks for ``--shape``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.errors import PipelineError
from pipeline.tensors import ModelSignature, TensorSpec

log = logging.getLogger(__name__)

Shape = tuple[int, ...]
ShapeRange = tuple[Shape, Shape, Shape]  # (min, opt, max)

DEFAULT_DYNAMIC_DIM = 64
SHAPE_SYNTAX = "INPUT:MIN/OPT/MAX with dims joined by 'x'"
_LEVELS = ("MIN", "OPT", "MAX")
_DIMS = re.compile(r"^-?\d+(x-?\d+)*$")


@dataclass(frozen=True)
class ShapeProfile:
    """One optimization profile: for each dynamic input name, its (min, opt, max) shapes."""

    shapes: Mapping[str, ShapeRange]

    def __str__(self) -> str:
        return " ".join(format_shape_spec(name, rng) for name, rng in self.shapes.items())


def format_shape_spec(name: str, shape_range: ShapeRange) -> str:
    """``image:1x8x8x1/64x8x8x1/64x8x8x1`` — the ``--shape`` text for one input's range."""
    return f"{name}:" + "/".join("x".join(str(d) for d in shape) for shape in shape_range)


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
) -> ShapeRange:
    """The range an input gets when ``--shape`` does not name it (see the module docstring).

    ``batch_range`` is the batch (min, opt, max) another input of the same profile was given:
    inputs share the batch, so the default follows it instead of 1/max_batch/max_batch.
    """
    mins, opts, maxs = [], [], []
    batch = batch_axis(spec)
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int) and dim >= 0:
            lo = opt = hi = dim
        elif axis == batch:
            lo, opt, hi = batch_range or (1, max_batch, max_batch)
        else:
            lo, opt, hi = 1, dynamic_default, dynamic_default
        mins.append(lo)
        opts.append(opt)
        maxs.append(hi)
    return tuple(mins), tuple(opts), tuple(maxs)


def profiles_from_args(
    specs: Sequence[str],
    signature: ModelSignature,
    *,
    max_batch: int,
    dynamic_default: int = DEFAULT_DYNAMIC_DIM,
) -> list[ShapeProfile]:
    """Turn ``--shape`` texts into optimization profiles covering every dynamic input.

    Repeating an input name starts the next profile. With no specs, one default profile.
    Every problem raises one :class:`PipelineError` naming the spec and the fix.
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

    profiles = []
    warned: set[tuple[str, int]] = set()
    for given in groups:
        batch_range = _given_batch_range(given, signature)
        shapes: dict[str, ShapeRange] = {}
        for spec in dynamic:
            if spec.name in given:
                shapes[spec.name] = given[spec.name]
                continue
            shapes[spec.name] = default_range(
                spec, max_batch=max_batch, dynamic_default=dynamic_default, batch_range=batch_range
            )
            _warn_unsized_axes(spec, shapes[spec.name], warned)
        profiles.append(ShapeProfile(shapes))
    for index, profile in enumerate(profiles):
        log.info("optimization profile %d: %s", index, str(profile) or "(model has no dynamic inputs)")
    return profiles


def _given_batch_range(given: Mapping[str, ShapeRange], signature: ModelSignature) -> tuple[int, int, int] | None:
    for name, (lo, opt, hi) in given.items():
        axis = batch_axis(signature.input(name))
        if axis is not None:
            return lo[axis], opt[axis], hi[axis]
    return None


def _warn_unsized_axes(spec: TensorSpec, shape_range: ShapeRange, warned: set[tuple[str, int]]) -> None:
    for axis, dim in enumerate(spec.shape):
        if axis in spec.dynamic_axes and axis != batch_axis(spec) and (spec.name, axis) not in warned:
            warned.add((spec.name, axis))
            log.warning(
                "input '%s' axis %d ('%s') is dynamic and no --shape gives its range; using %d/%d/%d — "
                "pass --shape %s with the sizes you serve",
                spec.name, axis, dim, shape_range[0][axis], shape_range[1][axis], shape_range[2][axis],
                format_shape_spec(spec.name, shape_range),
            )


def _syntax_fix(signature: ModelSignature, max_batch: int) -> str:
    example = "image:1x8x8x1/64x8x8x1/64x8x8x1"
    if signature.inputs:
        first = signature.inputs[0]
        example = format_shape_spec(first.name, default_range(first, max_batch=max_batch))
    return f"write --shape {SHAPE_SYNTAX}, e.g. --shape {example}"


def well_formed(text: str) -> bool:
    """Whether ``text`` has the ``INPUT:MIN/OPT/MAX`` form (checkable before the model is known)."""
    name, sep, ranges = text.rpartition(":")
    levels = ranges.split("/")
    return bool(sep and name and len(levels) == 3 and all(_DIMS.match(level) for level in levels))


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


def profiles_to_json(profiles: Sequence[ShapeProfile]) -> list[dict[str, dict[str, list[int]]]]:
    """JSON-able form for metadata: ``[{input: {"min": [...], "opt": [...], "max": [...]}}, ...]``."""
    return [
        {name: {"min": list(lo), "opt": list(opt), "max": list(hi)} for name, (lo, opt, hi) in p.shapes.items()}
        for p in profiles
    ]


def profiles_from_json(data: Any) -> list[ShapeProfile]:
    """Inverse of :func:`profiles_to_json`; raises PipelineError if ``data`` is not in that form."""
    problem = PipelineError(
        "the optimization profiles in the engine metadata are not in the expected form",
        "rebuild the engine so its metadata JSON is rewritten",
    )
    if not isinstance(data, list):
        raise problem
    profiles = []
    for entry in data:
        if not isinstance(entry, dict):
            raise problem
        shapes: dict[str, ShapeRange] = {}
        for name, levels in entry.items():
            if not isinstance(levels, dict) or set(levels) != {"min", "opt", "max"}:
                raise problem
            dims = [levels[key] for key in ("min", "opt", "max")]
            if not all(isinstance(d, list) and all(isinstance(v, int) for v in d) for d in dims):
                raise problem
            shapes[str(name)] = (tuple(dims[0]), tuple(dims[1]), tuple(dims[2]))
        profiles.append(ShapeProfile(shapes))
    return profiles
