"""Images as calibration samples: the input's layout, fitting (stretch / crop / pad), colour
conversion and scaling, and the one line that says what was done to them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError, require
from pipeline.data.arrays import fmt_shape
from pipeline.data.raw_files import fitted_image
from pipeline.data.tensors import TensorSpec

PREPROCESS_MODES = ("unit", "symmetric", "imagenet", "raw")
RESIZE_MODES = ("stretch", "crop", "pad")
# Images whose aspect ratio (W/H) differs from the input's by more than this factor are refused
# unless a resize mode says how to fit them: 1.1 lets 4:3 vs 1.33 rounding and 224 vs 220 through,
# while 4:3 photos into a square input (1.33) need --resize.
ASPECT_TOLERANCE = 1.1
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


@dataclass(frozen=True)
class ImageLayout:
    channels_first: bool
    channels: int
    height: int
    width: int

    def per_sample(self) -> tuple[int, int, int]:
        if self.channels_first:
            return (self.channels, self.height, self.width)
        return (self.height, self.width, self.channels)


def image_layout(spec: TensorSpec, hint: tuple[int, ...] | None) -> ImageLayout:
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
    return ImageLayout(channels_first, c, h, w)


def scan_images(files: list[Path], layout: ImageLayout, resize: str | None) -> tuple[Counter, Counter]:
    """Read every image's header (size, colour mode) and check its aspect ratio; decode each once,
    so a bad file fails now, by name. Returns the sizes and modes seen."""
    sizes: Counter = Counter()
    modes: Counter = Counter()
    for file in files:
        size, mode = image_header(file)
        check_aspect(file, size, layout, resize)
        sizes[size] += 1
        modes[mode] += 1
    for file in files:
        decoded_image(file, layout, "raw", resize or "stretch")
    return sizes, modes


_MODE_NAMES = {"L": "grayscale", "RGB": "RGB", "RGBA": "RGBA (alpha dropped)", "P": "palette", "LA": "grayscale+alpha (alpha dropped)", "I;16": "16-bit grayscale", "CMYK": "CMYK"}


def image_summary(count: int, folder: Path, sizes: Counter, modes: Counter, layout: ImageLayout, fit: str, preprocess: str) -> str:
    """One line: how many images, resized from what to what, which colour conversion, which scaling."""
    target = f"{layout.width}×{layout.height}"
    common = [f"{w}×{h}" + (f" ({n})" if len(sizes) > 1 else "") for (w, h), n in sizes.most_common(3)]
    origin = ", ".join(common) + (f" and {len(sizes) - 3} other sizes" if len(sizes) > 3 else "")
    if set(sizes) == {(layout.width, layout.height)}:
        resized = f"{target}, not resized"
    else:
        how = {"stretch": "stretched", "crop": "centre-cropped to the aspect ratio", "pad": "padded with black to the aspect ratio"}[fit]
        resized = f"resized {origin} → {target} ({how}, bilinear)"
    want = "grayscale" if layout.channels == 1 else "RGB"
    colours = ", ".join(_MODE_NAMES.get(m, m) for m in modes)
    converted = f"{colours} → {want}" if set(modes) != {"L" if layout.channels == 1 else "RGB"} else f"{want}, no colour conversion"
    order = "CHW" if layout.channels_first else "HWC"
    return f"{count} images from {folder}: {resized}; {converted}; {preprocess} scaling; {order} layout"


def image_header(path: Path) -> tuple[tuple[int, int], str]:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            return opened.size, opened.mode
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise PipelineError(f"cannot read image '{path}': {exc}", "remove or replace the file") from None


def check_aspect(path: Path, size: tuple[int, int], layout: ImageLayout, resize: str | None) -> None:
    width, height = size
    if resize is not None or width == 0 or height == 0:
        return
    image_aspect, input_aspect = width / height, layout.width / layout.height
    if max(image_aspect, input_aspect) / min(image_aspect, input_aspect) > ASPECT_TOLERANCE:
        raise PipelineError(
            f"image '{path}' is {width}×{height} (aspect {image_aspect:.2f}), the model input is {layout.width}×{layout.height} "
            f"(aspect {input_aspect:.2f}): resizing would distort it beyond the {ASPECT_TOLERANCE:g}× tolerance",
            "say how to fit it: --resize stretch (distort), crop (centre crop to the aspect ratio) or pad (black borders)",
        )


def decoded_image(path: Path, layout: ImageLayout, preprocess: str, fit: str = "stretch") -> np.ndarray:
    """One image as float32 in the model's layout, fitted, resized and preprocessed."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            converted = opened.convert("L" if layout.channels == 1 else "RGB")
            pixels = np.asarray(fitted_image(converted, layout.height, layout.width, fit), dtype=np.float32)
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
