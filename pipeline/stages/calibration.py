"""Calibration data for INT8 quantization: found, checked against the model, handed out batch by batch.

Accepted sources (first axis of every array = sample):

* an ``.npz`` file with one array per model input name (``labels`` is allowed and ignored);
* a folder holding ``calib.npz`` (the layout ``calibration/<model>/calib.npz``);
* a folder of ``<input name>.npy`` files (memory-mapped, so they may be larger than RAM);
* for inputs with dynamic non-batch axes, samples of different sizes in buckets: arrays (or
  ``.npy`` files) named ``<input>__<bucket>``, e.g. ``tokens__len16`` and ``tokens__len20``,
  one array per input in every bucket (see :mod:`pipeline.data.arrays`). Sizes must lie inside the
  build's shape profiles; batches never mix sizes;
* a folder of JPEG/PNG images, for models with a single image input (NHWC or NCHW, 1 or 3
  channels): each is converted to grayscale/RGB, fitted to the input's H×W (refused when the
  aspect ratio differs by more than :data:`ASPECT_TOLERANCE` unless ``resize`` says how) and
  scaled by the chosen preprocessing. One line says what was done. Images are decoded one
  batch at a time.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError, require
from pipeline.core.fingerprint import hash_path, hash_settings
from pipeline.data.arrays import PerSample, checked_inputs, load_npy, load_npz
from pipeline.data.buckets import split_buckets
from pipeline.data.tensors import ModelSignature
from pipeline.data.workspace import ModelData
from pipeline.stages.calibration_images import (  # noqa: F401 - PREPROCESS_MODES, RESIZE_MODES, ASPECT_TOLERANCE are this stage's options
    ASPECT_TOLERANCE,
    IMAGE_SUFFIXES,
    PREPROCESS_MODES,
    RESIZE_MODES,
    decoded_image,
    image_layout,
    image_summary,
    scan_images,
)

log = logging.getLogger(__name__)

CALIB_FILE = ModelData.CALIB
MIN_SAMPLES = 100

Take = Callable[[int, int], dict[str, np.ndarray]]


@dataclass(frozen=True)
class SampleGroup:
    """Samples that share their per-sample shapes (one or more buckets), taken ``start:stop``."""

    label: str
    count: int
    shapes: dict[str, PerSample]
    take: Take = field(repr=False, compare=False)


@dataclass(frozen=True)
class CalibrationData:
    """Validated calibration samples; only the requested batch is ever materialised.

    ``origin`` is the file or folder read; ``settings`` records what shaped the samples
    (preprocessing, sample count, shapes), so :meth:`fingerprint` changes when either changes.
    Samples come in ``groups`` of equal per-sample shapes (one group unless the data has
    buckets of different sequence lengths); a batch never mixes groups.
    """

    origin: Path
    input_names: tuple[str, ...]
    num_samples: int
    settings: dict[str, object]
    groups: tuple[SampleGroup, ...] = field(repr=False, compare=False)
    sizes: dict[str, dict[int, Counter]] = field(default_factory=dict, repr=False, compare=False)

    def samples(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Samples ``start:stop`` (counted across groups, all within one group) in the model's dtypes."""
        require(0 <= start < stop <= self.num_samples, f"sample range {start}:{stop} is outside 0:{self.num_samples}")
        offset = 0
        for group in self.groups:
            if start < offset + group.count:
                require(
                    stop <= offset + group.count,
                    f"calibration samples {start}:{stop} span groups of different sizes ({', '.join(g.label for g in self.groups)}), which one array cannot hold",
                    "pass labeled evaluation data (--eval-data) for a model whose calibration data comes in buckets of different sizes",
                )
                return group.take(start - offset, stop - offset)
            offset += group.count
        raise AssertionError("unreachable: the range was checked")

    def num_batches(self, batch_size: int, *, drop_last: bool = False) -> int:
        """How many batches :meth:`batches` yields for ``batch_size``."""
        require(batch_size >= 1, f"batch size must be at least 1, got {batch_size}", "pass a positive batch size")
        total = 0
        for group in self.groups:
            full, rest = divmod(group.count, batch_size)
            total += full if drop_last or rest == 0 else full + 1
        return total

    def batch(self, index: int, batch_size: int) -> dict[str, np.ndarray]:
        """Batch number ``index`` (0-based) of :meth:`batches` for ``batch_size``."""
        for number, batch in enumerate(self.batches(batch_size)):
            if number == index:
                return batch
        raise PipelineError(f"batch {index} is beyond the {self.num_batches(batch_size)} batches of {batch_size}")

    def batches(self, batch_size: int, *, drop_last: bool = False) -> Iterator[dict[str, np.ndarray]]:
        """Feed dicts of at most ``batch_size`` samples, group by group, in order; ``drop_last`` skips
        a short tail of each group (for models whose batch dimension is fixed)."""
        require(batch_size >= 1, f"batch size must be at least 1, got {batch_size}", "pass a positive batch size")
        for group in self.groups:
            for start in range(0, group.count, batch_size):
                stop = min(start + batch_size, group.count)
                if drop_last and stop - start < batch_size:
                    break
                yield group.take(start, stop)

    def first(self, count: int) -> CalibrationData:
        """Only the first ``count`` samples, group by group (the rest held out, e.g. as an unlabeled comparison set)."""
        require(1 <= count <= self.num_samples, f"cannot keep {count} of {self.num_samples} calibration samples")
        groups, left = [], count
        for group in self.groups:
            if left <= 0:
                break
            groups.append(replace(group, count=min(group.count, left)))
            left -= group.count
        return replace(self, num_samples=count, settings={**self.settings, "samples": count}, groups=tuple(groups))

    def holdout(self, count: int) -> tuple[CalibrationData | None, list[tuple[str, dict[str, np.ndarray]]]]:
        """Split off ``count`` samples, the tail of every size group in proportion to its size: the
        calibration data left (None when nothing is), and the held-out samples as (group label, arrays)."""
        require(1 <= count <= self.num_samples, f"cannot hold out {count} of {self.num_samples} calibration samples")
        kept_groups, held = [], []
        for group, share in zip(self.groups, proportional_shares([g.count for g in self.groups], count), strict=True):
            if share:
                held.append((group.label, group.take(group.count - share, group.count)))
            if group.count - share:
                kept_groups.append(replace(group, count=group.count - share))
        kept = self.num_samples - count
        rest = replace(self, num_samples=kept, settings={**self.settings, "samples": kept, "held_out": count}, groups=tuple(kept_groups))
        return (rest if kept else None), held

    def largest_shapes(self) -> dict[str, PerSample]:
        """Per input, the elementwise largest per-sample shape of any group (for memory estimates)."""
        largest: dict[str, PerSample] = {}
        for group in self.groups:
            for name, shape in group.shapes.items():
                old = largest.get(name)
                largest[name] = shape if old is None else tuple(max(a, b) for a, b in zip(old, shape, strict=True))
        return largest

    def fingerprint(self) -> str:
        """sha256 of the source files and the settings that shaped the samples."""
        return hash_settings({"data": hash_path(self.origin), **self.settings})


def proportional_shares(counts: Sequence[int], total: int) -> list[int]:
    """``total`` split over groups of ``counts`` in proportion to their sizes (largest remainders), each
    share at most its group's count: a remainder goes only to a group whose exact share is fractional,
    which is below its count, so no group gives more samples than it has."""
    require(0 <= total <= sum(counts), f"cannot take {total} of {sum(counts)} samples")
    whole = sum(counts)
    exact = [total * c / whole if whole else 0.0 for c in counts]
    shares = [math.floor(e) for e in exact]
    by_remainder = sorted(range(len(counts)), key=lambda i: (shares[i] - exact[i], i))
    for i in by_remainder[: total - sum(shares)]:
        shares[i] += 1
    return shares


def calibration_from_path(
    path: Path,
    signature: ModelSignature,
    *,
    preprocess: str = "unit",
    min_samples: int = MIN_SAMPLES,
    max_samples: int | None = None,
    shape_hint: Mapping[str, tuple[int, ...]] | None = None,
    shape_bounds: Mapping[str, tuple[PerSample, PerSample]] | None = None,
    resize: str | None = None,
) -> CalibrationData:
    """Find and validate calibration data at ``path`` for a model with ``signature``.

    ``preprocess`` (``unit`` 0..1, ``symmetric`` -1..1, ``imagenet`` mean/std, ``raw`` 0..255)
    and ``resize`` (``stretch``, ``crop``, ``pad``; required when an image's aspect ratio differs
    from the input's by more than :data:`ASPECT_TOLERANCE`) apply to images only. ``shape_hint``
    gives the per-sample shape (no batch axis, in the model's layout) images are resized to when
    the model's H×W are dynamic, e.g. ``{"image": (224, 224, 3)}``. ``shape_bounds`` gives per
    input the per-sample (min, max) shapes of the build's shape profiles: array samples of any
    size inside them are accepted, sizes outside are an error. At most ``max_samples`` are used
    (spread over the buckets); fewer than ``min_samples`` is an error.
    """
    path = Path(path)
    require(
        preprocess in PREPROCESS_MODES,
        f"unknown preprocessing '{preprocess}'",
        f"use one of: {', '.join(PREPROCESS_MODES)}",
    )
    require(
        resize is None or resize in RESIZE_MODES,
        f"unknown resize mode '{resize}'",
        f"use one of: {', '.join(RESIZE_MODES)}",
    )
    require(path.exists(), f"calibration data '{path}' does not exist", "pass an .npz file or a folder of .npy files or images")
    require(min_samples >= 1, f"min_samples must be at least 1, got {min_samples}")
    require(max_samples is None or max_samples >= 1, f"max_samples must be at least 1, got {max_samples}")
    hints = {name: tuple(shape) for name, shape in (shape_hint or {}).items()}
    for name in [*hints, *(shape_bounds or {})]:
        signature.input(name)  # raises, listing the model's input names

    if path.is_file():
        require(
            path.suffix == ".npz",
            f"calibration file '{path}' is not an .npz archive",
            "pass an .npz file (one array per input name) or a folder of .npy files or images",
        )
        arrays = load_npz(path)
        origin = path
    elif (path / CALIB_FILE).is_file():
        origin = path / CALIB_FILE
        arrays = load_npz(origin)
    else:
        npys = _visible_files(path, (".npy",))
        images = _visible_files(path, IMAGE_SUFFIXES)
        if npys:
            arrays = {f.stem: load_npy(f) for f in npys}
            origin = path
        elif images:
            return _image_calibration(path, images, signature, preprocess, min_samples, max_samples, hints, resize)
        else:
            raise _nothing_usable(path, signature)
    return _array_calibration(origin, arrays, signature, min_samples, max_samples, shape_bounds or {})


def shape_bounds(profiles: Iterable[Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]]) -> dict[str, tuple[PerSample, PerSample]]:
    """Per input, the per-sample (min, max) shapes that the union of shape profiles (each
    ``{input: (min, opt, max)}`` with the batch axis first) covers: what ``shape_bounds`` of
    :func:`calibration_from_path` takes."""
    bounds: dict[str, tuple[PerSample, PerSample]] = {}
    for profile in profiles:
        for name, (low, _opt, high) in profile.items():
            lo, hi = tuple(low[1:]), tuple(high[1:])
            if name in bounds:
                old_lo, old_hi = bounds[name]
                lo = tuple(min(a, b) for a, b in zip(old_lo, lo, strict=True))
                hi = tuple(max(a, b) for a, b in zip(old_hi, hi, strict=True))
            bounds[name] = (lo, hi)
    return bounds


# ----------------------------------------------------------------------------- arrays


def _visible_files(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    return sorted(
        f for f in folder.iterdir() if f.is_file() and not f.name.startswith(".") and f.suffix.lower() in suffixes
    )


def _names(signature: ModelSignature) -> str:
    return ", ".join(spec.name for spec in signature.inputs)


def _nothing_usable(path: Path, signature: ModelSignature) -> PipelineError:
    """Say what the folder holds and what it should hold."""
    visible = sorted(f.name for f in path.iterdir() if not f.name.startswith("."))
    wanted = f"{CALIB_FILE}, <input>.npy files ({_names(signature)}) or JPEG/PNG images"
    if not visible:
        return PipelineError(f"calibration folder '{path}' is empty: it has no {wanted}", f"add {CALIB_FILE} with one array per input ({_names(signature)}) or representative images")
    shown = ", ".join(visible[:5]) + (f" and {len(visible) - 5} more" if len(visible) > 5 else "")
    others = [name for name in visible if name.endswith(".npz")]
    fix = (
        f"pass the file itself (--calibration {path / others[0]}) or rename it to {CALIB_FILE}"
        if others
        else f"add {CALIB_FILE} with one array per input ({_names(signature)}) or representative images"
    )
    return PipelineError(f"calibration folder '{path}' holds {shown} but no {wanted}", fix)


def _array_calibration(
    origin: Path,
    arrays: dict[str, np.ndarray],
    signature: ModelSignature,
    min_samples: int,
    max_samples: int | None,
    bounds: Mapping[str, tuple[PerSample, PerSample]],
) -> CalibrationData:
    expected = [spec.name for spec in signature.inputs]
    dtypes = {spec.name: spec.dtype for spec in signature.inputs}
    buckets = split_buckets(origin, arrays, signature)
    checked = {}
    for bucket, group in buckets.items():
        where = Path(f"{origin}[{bucket}]") if bucket else origin
        checked[bucket] = checked_inputs(where, group, signature, bounds=bounds)
    found = sum(len(next(iter(group.values()))) for group in checked.values())
    _require_enough(origin, found, min_samples)
    count = found if max_samples is None else min(found, max_samples)

    by_shape: dict[tuple, list[tuple[str, dict[str, np.ndarray]]]] = {}
    for bucket, group in checked.items():
        key = tuple((name, group[name].shape[1:]) for name in expected)
        by_shape.setdefault(key, []).append((bucket, group))
    quotas = _quotas({key: sum(len(g[expected[0]]) for _, g in parts) for key, parts in by_shape.items()}, count)
    groups = []
    for key, parts in by_shape.items():
        groups.append(_group(parts, quotas[key], dict(key), dtypes))
    groups = [g for g in groups if g.count > 0]

    sizes = _sizes_seen(checked, signature)
    shapes = {name: list(shape) for name, shape in groups[0].shapes.items()} if len(groups) == 1 else {g.label: {n: list(s) for n, s in g.shapes.items()} for g in groups}
    if len(groups) > 1:
        spread = "; ".join(f"{name} dim {axis}: " + ", ".join(f"{size} ({n})" for size, n in sorted(c.items())) for name, axes in sizes.items() for axis, c in axes.items())
        log.info("calibration data: %d of %d samples from %s in %d shape groups (%s)", count, found, origin, len(groups), spread)
    else:
        log.info("calibration data: %d of %d samples from %s", count, found, origin)
    settings = {"kind": "arrays", "samples": count, "shapes": shapes}
    return CalibrationData(origin, tuple(expected), count, settings, tuple(groups), sizes)


def _sizes_seen(buckets: Mapping[str, Mapping[str, np.ndarray]], signature: ModelSignature) -> dict[str, dict[int, Counter]]:
    """``{input: {axis: Counter(size → samples)}}`` for every dynamic non-batch axis."""
    seen: dict[str, dict[int, Counter]] = {}
    for group in buckets.values():
        for spec in signature.inputs:
            arr = group[spec.name]
            for axis in spec.dynamic_axes:
                if 0 < axis < arr.ndim:
                    seen.setdefault(spec.name, {}).setdefault(axis, Counter())[int(arr.shape[axis])] += len(arr)
    return seen


def _quotas(counts: Mapping[tuple, int], wanted: int) -> dict[tuple, int]:
    """Spread ``wanted`` samples over groups in proportion to their size (largest remainders)."""
    total = sum(counts.values())
    if wanted >= total:
        return dict(counts)
    exact = {key: n * wanted / total for key, n in counts.items()}
    quotas = {key: math.floor(v) for key, v in exact.items()}
    for key in sorted(exact, key=lambda k: exact[k] - quotas[k], reverse=True)[: wanted - sum(quotas.values())]:
        quotas[key] += 1
    return quotas


def _group(parts: list[tuple[str, dict[str, np.ndarray]]], quota: int, shapes: dict[str, PerSample], dtypes: dict) -> SampleGroup:
    """One sample group over buckets of equal shapes: their first ``quota`` samples, bucket after bucket."""
    spans = []
    left = quota
    for bucket, arrays in parts:
        count = min(left, len(next(iter(arrays.values()))))
        if count:
            spans.append((arrays, count))
        left -= count

    label = "+".join(bucket or "(plain)" for bucket, _ in parts)
    return SampleGroup(label, quota, {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}, _Spans(spans, dtypes))


@dataclass(frozen=True)
class _Spans:
    """Samples ``start:stop`` across the spans of a group's buckets (a class, not a closure: a stage in a child process gets it pickled)."""

    spans: list[tuple[dict[str, np.ndarray], int]]
    dtypes: dict

    def __call__(self, start: int, stop: int) -> dict[str, np.ndarray]:
        pieces: dict[str, list[np.ndarray]] = {name: [] for name in self.dtypes}
        offset = 0
        for arrays, n in self.spans:
            lo, hi = max(start - offset, 0), min(stop - offset, n)
            if lo < hi:
                for name in self.dtypes:
                    pieces[name].append(arrays[name][lo:hi])
            offset += n
        return {name: np.ascontiguousarray(np.concatenate(parts_) if len(parts_) > 1 else parts_[0], dtype=self.dtypes[name])
                for name, parts_ in pieces.items()}


def _require_enough(origin: Path, found: int, min_samples: int) -> None:
    require(
        found >= min_samples,
        f"calibration data '{origin}' has {found} samples, at least {min_samples} are required",
        f"add representative samples until there are at least {min_samples} (a few hundred is typical)",
    )


# ----------------------------------------------------------------------------- images


def _image_calibration(
    folder: Path,
    files: list[Path],
    signature: ModelSignature,
    preprocess: str,
    min_samples: int,
    max_samples: int | None,
    hints: dict[str, tuple[int, ...]],
    resize: str | None,
) -> CalibrationData:
    require(
        len(signature.inputs) == 1,
        f"a folder of images can only calibrate a model with one image input; this model has inputs {_names(signature)}",
        f"write {CALIB_FILE} with one preprocessed array per input instead",
    )
    spec = signature.inputs[0]
    require(
        spec.dtype.kind == "f",
        f"model input '{spec.name}' is {spec.dtype}, images can only feed a float input",
        f"write {CALIB_FILE} with {spec.dtype} samples instead",
    )
    layout = image_layout(spec, hints.get(spec.name))
    require(
        preprocess != "imagenet" or layout.channels == 3,
        f"preprocessing 'imagenet' needs an RGB input, but '{spec.name}' has {layout.channels} channel",
        "use --preprocess unit, symmetric or raw for grayscale models",
    )
    _require_enough(folder, len(files), min_samples)
    files = files if max_samples is None else files[:max_samples]
    sizes, modes = scan_images(files, layout, resize)
    dtype = spec.dtype
    fit = resize or "stretch"

    def take(start: int, stop: int) -> dict[str, np.ndarray]:
        batch = np.stack([decoded_image(f, layout, preprocess, fit) for f in files[start:stop]])
        return {spec.name: batch.astype(dtype, copy=False)}

    log.info("calibration data: %s", image_summary(len(files), folder, sizes, modes, layout, fit, preprocess))
    settings = {"kind": "images", "samples": len(files), "preprocess": preprocess, "resize": fit, "shape": list(layout.per_sample())}
    group = SampleGroup("images", len(files), {spec.name: layout.per_sample()}, take)
    return CalibrationData(folder, (spec.name,), len(files), settings, (group,))
