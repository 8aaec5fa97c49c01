"""Calibration data for INT8 quantization: found, checked against the model, handed out batch by batch.

Accepted sources (first axis of every array = sample):

* an ``.npz`` file with one array per model input name (``labels`` is allowed and ignored);
* a folder holding ``calib.npz`` (the layout ``calibration/<model>/calib.npz``);
* a folder of ``<input name>.npy`` files (memory-mapped, so they may be larger than RAM);
* a folder of JPEG/PNG images, for models with a single image input (NHWC or NCHW, 1 or 3
  channels): each is converted to grayscale/RGB, resized to the input's H×W and scaled by the
  chosen preprocessing. Images are decoded one batch at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from pipeline.arrays import checked_inputs, fmt_shape, load_npy, load_npz
from pipeline.errors import PipelineError, require
from pipeline.fingerprint import hash_path, hash_settings
from pipeline.tensors import ModelSignature, TensorSpec
from pipeline.workspace import ModelData

log = logging.getLogger(__name__)

PREPROCESS_MODES = ("unit", "symmetric", "imagenet", "raw")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
CALIB_FILE = ModelData.CALIB
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

Take = Callable[[int, int], dict[str, np.ndarray]]


@dataclass(frozen=True)
class CalibrationData:
    """Validated calibration samples; only the requested batch is ever materialised.

    ``origin`` is the file or folder read; ``settings`` records what shaped the samples
    (preprocessing, sample count, shapes), so :meth:`fingerprint` changes when either changes.
    """

    origin: Path
    input_names: tuple[str, ...]
    num_samples: int
    settings: dict[str, object]
    _take: Take = field(repr=False, compare=False)

    def samples(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Samples ``start:stop`` of every input, in the model's dtypes (one feed dict)."""
        require(0 <= start < stop <= self.num_samples, f"sample range {start}:{stop} is outside 0:{self.num_samples}")
        return self._take(start, stop)

    def num_batches(self, batch_size: int, *, drop_last: bool = False) -> int:
        """How many batches :meth:`batches` yields for ``batch_size``."""
        require(batch_size >= 1, f"batch size must be at least 1, got {batch_size}", "pass a positive batch size")
        full, rest = divmod(self.num_samples, batch_size)
        return full if drop_last or rest == 0 else full + 1

    def batch(self, index: int, batch_size: int) -> dict[str, np.ndarray]:
        """Batch number ``index`` (0-based) of size ``batch_size`` (the last one may be smaller)."""
        start = index * batch_size
        return self.samples(start, min(start + batch_size, self.num_samples))

    def batches(self, batch_size: int, *, drop_last: bool = False) -> Iterator[dict[str, np.ndarray]]:
        """Feed dicts of at most ``batch_size`` samples, in order; ``drop_last`` skips a short tail
        (for models whose batch dimension is fixed)."""
        for index in range(self.num_batches(batch_size, drop_last=drop_last)):
            yield self.batch(index, batch_size)

    def first(self, count: int) -> CalibrationData:
        """Only the first ``count`` samples (the rest held out, e.g. as an unlabeled comparison set)."""
        require(1 <= count <= self.num_samples, f"cannot keep {count} of {self.num_samples} calibration samples")
        return replace(self, num_samples=count, settings={**self.settings, "samples": count})

    def fingerprint(self) -> str:
        """sha256 of the source files and the settings that shaped the samples."""
        return hash_settings({"data": hash_path(self.origin), **self.settings})


def calibration_from_path(
    path: Path,
    signature: ModelSignature,
    *,
    preprocess: str = "unit",
    min_samples: int = 100,
    max_samples: int | None = None,
    shape_hint: Mapping[str, tuple[int, ...]] | None = None,
) -> CalibrationData:
    """Find and validate calibration data at ``path`` for a model with ``signature``.

    ``preprocess`` (``unit`` 0..1, ``symmetric`` -1..1, ``imagenet`` mean/std, ``raw`` 0..255)
    applies to images only. ``shape_hint`` gives the per-sample shape (no batch axis, in the
    model's layout) of inputs whose dims are dynamic, e.g. ``{"image": (224, 224, 3)}``; it is
    required to resize images for a model with dynamic H×W. At most ``max_samples`` are used;
    fewer than ``min_samples`` is an error.
    """
    path = Path(path)
    require(
        preprocess in PREPROCESS_MODES,
        f"unknown preprocessing '{preprocess}'",
        f"use one of: {', '.join(PREPROCESS_MODES)}",
    )
    require(path.exists(), f"calibration data '{path}' does not exist", "pass an .npz file or a folder of .npy files or images")
    require(min_samples >= 1, f"min_samples must be at least 1, got {min_samples}")
    require(max_samples is None or max_samples >= 1, f"max_samples must be at least 1, got {max_samples}")
    hints = {name: tuple(shape) for name, shape in (shape_hint or {}).items()}
    for name in hints:
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
            return _image_calibration(path, images, signature, preprocess, min_samples, max_samples, hints)
        else:
            raise PipelineError(
                f"calibration folder '{path}' is empty: it has no {CALIB_FILE}, no <input>.npy files and no JPEG/PNG images",
                f"add {CALIB_FILE} with one array per input ({_names(signature)}) or representative images",
            )
    return _array_calibration(origin, arrays, signature, min_samples, max_samples, hints)


# ----------------------------------------------------------------------------- arrays


def _visible_files(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    return sorted(
        f for f in folder.iterdir() if f.is_file() and not f.name.startswith(".") and f.suffix.lower() in suffixes
    )


def _names(signature: ModelSignature) -> str:
    return ", ".join(spec.name for spec in signature.inputs)


def _array_calibration(
    origin: Path,
    arrays: dict[str, np.ndarray],
    signature: ModelSignature,
    min_samples: int,
    max_samples: int | None,
    hints: dict[str, tuple[int, ...]],
) -> CalibrationData:
    expected = [spec.name for spec in signature.inputs]
    checked = checked_inputs(origin, arrays, signature, hints=hints)
    counts = {name: len(arr) for name, arr in checked.items()}
    found = next(iter(counts.values()))
    _require_enough(origin, found, min_samples)
    count = found if max_samples is None else min(found, max_samples)
    dtypes = {spec.name: spec.dtype for spec in signature.inputs}

    def take(start: int, stop: int) -> dict[str, np.ndarray]:
        return {name: np.ascontiguousarray(arr[start:stop], dtype=dtypes[name]) for name, arr in checked.items()}

    log.info("calibration data: %d of %d samples from %s", count, found, origin)
    shapes = {name: list(arr.shape[1:]) for name, arr in checked.items()}
    return CalibrationData(origin, tuple(expected), count, {"kind": "arrays", "samples": count, "shapes": shapes}, take)


def _require_enough(origin: Path, found: int, min_samples: int) -> None:
    require(
        found >= min_samples,
        f"calibration data '{origin}' has {found} samples, at least {min_samples} are required",
        f"add representative samples until there are at least {min_samples} (a few hundred is typical)",
    )


# ----------------------------------------------------------------------------- images


@dataclass(frozen=True)
class _ImageLayout:
    channels_first: bool
    channels: int
    height: int
    width: int

    def per_sample(self) -> tuple[int, int, int]:
        if self.channels_first:
            return (self.channels, self.height, self.width)
        return (self.height, self.width, self.channels)


def _image_layout(spec: TensorSpec, hint: tuple[int, ...] | None) -> _ImageLayout:
    """NHWC or NCHW with 1 or 3 channels; dynamic dims filled from the hint."""
    not_image = PipelineError(
        f"model input '{spec.name}' {fmt_shape(spec.shape)} does not look like an image "
        "(NHWC or NCHW with 1 or 3 channels)",
        "calibrate it with an .npz file holding preprocessed samples",
    )
    if len(spec.shape) != 4:
        raise not_image
    if hint is not None:
        require(len(hint) == 3, f"the shape hint {fmt_shape(hint)} for '{spec.name}' is not (H, W, C) or (C, H, W)")
    dims = [d if isinstance(d, int) and d > 0 else None for d in spec.shape[1:]]
    if hint is not None:
        dims = [d if d is not None else int(h) for d, h in zip(dims, hint, strict=True)]
    # Keras models are channels-last: prefer NHWC when both ends could be channels.
    if dims[2] in (1, 3):
        channels_first, (h, w, c) = False, dims
    elif dims[0] in (1, 3):
        channels_first, (c, h, w) = True, dims
    else:
        raise not_image
    if h is None or w is None or c is None:
        raise PipelineError(
            f"model input '{spec.name}' {fmt_shape(spec.shape)} has a dynamic image size",
            "pass the per-sample shape as a shape hint, e.g. (224, 224, 3)",
        )
    return _ImageLayout(channels_first, c, h, w)


def _image_calibration(
    folder: Path,
    files: list[Path],
    signature: ModelSignature,
    preprocess: str,
    min_samples: int,
    max_samples: int | None,
    hints: dict[str, tuple[int, ...]],
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
    layout = _image_layout(spec, hints.get(spec.name))
    require(
        preprocess != "imagenet" or layout.channels == 3,
        f"preprocessing 'imagenet' needs an RGB input, but '{spec.name}' has {layout.channels} channel",
        "use --preprocess unit, symmetric or raw for grayscale models",
    )
    _require_enough(folder, len(files), min_samples)
    files = files if max_samples is None else files[:max_samples]
    for file in files:  # decode every file once up front so a bad one fails now, by name
        _decoded_image(file, layout, preprocess)
    dtype = spec.dtype

    def take(start: int, stop: int) -> dict[str, np.ndarray]:
        batch = np.stack([_decoded_image(f, layout, preprocess) for f in files[start:stop]])
        return {spec.name: batch.astype(dtype, copy=False)}

    log.info("calibration data: %d images from %s (%s preprocessing, %s)", len(files), folder, preprocess, layout)
    settings = {"kind": "images", "samples": len(files), "preprocess": preprocess, "shape": list(layout.per_sample())}
    return CalibrationData(folder, (spec.name,), len(files), settings, take)


def _decoded_image(path: Path, layout: _ImageLayout, preprocess: str) -> np.ndarray:
    """One image as float32 in the model's layout, resized and preprocessed."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            converted = opened.convert("L" if layout.channels == 1 else "RGB")
            resized = converted.resize((layout.width, layout.height), Image.Resampling.BILINEAR)
            pixels = np.asarray(resized, dtype=np.float32)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise PipelineError(f"cannot read image '{path}': {exc}", "remove or replace the file") from None
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    if preprocess == "unit":
        pixels = pixels / 255.0
    elif preprocess == "symmetric":
        pixels = pixels / 127.5 - 1.0
    elif preprocess == "imagenet":
        pixels = (pixels / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
    if layout.channels_first:
        pixels = np.transpose(pixels, (2, 0, 1))
    return pixels.astype(np.float32, copy=False)
