"""Optimization profiles as values: an input's (MIN, OPT, MAX) shapes, a profile of them, their
``--shape`` text (its syntax, checked before the model is known, and its formatting) and their JSON
form (the engine metadata). How a build chooses them from ``--shape`` options, the model and its data
is :mod:`pipeline.stages.shapes`."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.core.errors import PipelineError

Shape = tuple[int, ...]
ShapeRange = tuple[Shape, Shape, Shape]  # (min, opt, max)

SHAPE_SYNTAX = "INPUT:MIN/OPT/MAX with dims joined by 'x'"
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


def well_formed(text: str) -> bool:
    """Whether ``text`` has the ``INPUT:MIN/OPT/MAX`` form (checkable before the model is known)."""
    name, sep, ranges = text.rpartition(":")
    levels = ranges.split("/")
    return bool(sep and name and len(levels) == 3 and all(_DIMS.match(level) for level in levels))


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
