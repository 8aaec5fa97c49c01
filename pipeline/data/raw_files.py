"""Raw inputs as clients send them: folders of image files (labeled by sub-folder, the ImageFolder convention),
what the raw-input preprocessing does to them (:class:`ImagePreprocess`, recorded in its graph), and the reference
tensor of one file (what Keras's own image utilities make of it)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError, require

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
TEXT_SUFFIXES = (".csv", ".txt")
TEXT_INPUT = "text"  # the text ensemble's input: one UTF-8 string per row
BYTES_INPUT = "image_bytes"  # the ensemble's input: one encoded image file, TYPE_STRING [1]
HWC_INPUT = "image_hwc"  # the ``_hwc`` ensemble's input: one decoded uint8 image, any size
SPEC_KEY = "pipeline.image_preprocess"  # the preprocessing, as JSON in the graph's metadata


@dataclass(frozen=True)
class ImagePreprocess:
    """What the graph does to an image: the model input it feeds, its size and channels, the fit, the scale."""

    input: str  # the model's input name (the graph's output)
    height: int
    width: int
    channels: int  # 1 (grayscale) or 3 (RGB)
    channels_first: bool
    fit: str  # stretch | crop | pad
    scale: tuple[float, ...]  # per channel: x · scale + offset
    offset: tuple[float, ...]
    scaling: str  # where the scale came from, in words (the build says it)
    channel_order: str = "RGB"  # "BGR" only to plant a mismatch in tests
    interpolation: str = "bilinear"  # a key of RESIZE_FILTERS ("nearest" only to plant a mismatch in tests)

    def describe(self) -> str:
        """One line: size, fit, colour, scaling."""
        colour = "grayscale" if self.channels == 1 else self.channel_order
        return (f"decode JPEG/PNG → {colour} → {self.fit} to {self.width}×{self.height} ({self.interpolation}) → "
                f"{self.scaling} → {'NCHW' if self.channels_first else 'NHWC'} '{self.input}'")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ImagePreprocess:
        values = json.loads(text)
        if values.get("interpolation") == "linear":  # graphs written before --resize-filter: PIL's filter was the one
            values["interpolation"] = "pil-bilinear"
        return cls(**{**values, "scale": tuple(values["scale"]), "offset": tuple(values["offset"])})


RESIZE_FILTERS = {  # --resize-filter: how each resizes, as Keras does
    "bilinear": "tf.image.resize bilinear, no antialiasing, float result: keras.utils.image_dataset_from_directory's and "
                "keras.layers.Resizing's default (crop: smart_resize's box; pad: tf.image.resize_with_pad)",
    "pil-bilinear": "PIL's bilinear, antialiased when shrinking, rounded to 0..255: keras.utils.load_img(interpolation='bilinear') "
                    "(crop: load_img(keep_aspect_ratio=True)'s box; pad: a black canvas, then the resize)",
}

PREPROCESS_SCALES = {  # --preprocess: (scale, offset) per channel, RGB
    "unit": ((1 / 255,) * 3, (0.0,) * 3),
    "symmetric": ((1 / 127.5,) * 3, (-1.0,) * 3),
    "imagenet": (tuple(1 / (255 * s) for s in (0.229, 0.224, 0.225)), tuple(-m / s for m, s in zip((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))),
    "raw": ((1.0,) * 3, (0.0,) * 3),
}





@dataclass(frozen=True)
class ImageFiles:
    """Image files in a stable order, with the class index of each (None: the folder has no class sub-folders)."""

    folder: Path
    files: tuple[Path, ...]
    labels: tuple[int, ...] | None
    classes: tuple[str, ...]  # the class names the labels index

    @property
    def source(self) -> str:
        return str(self.folder)

    def payloads(self) -> list[tuple[str, np.ndarray, str]]:
        """Per file, what a client sends: (input name, the file's bytes, Triton datatype)."""
        return [(BYTES_INPUT, np.array([path.read_bytes()], dtype=object), "BYTES") for path in self.files]

    def names(self) -> list[str]:
        return [f"{p.parent.name}/{p.name}" for p in self.files]


@dataclass(frozen=True)
class TextSamples:
    """Sentences in file order, with the class index of each (None: the file has no labels)."""

    path: Path
    texts: tuple[str, ...]
    labels: tuple[int, ...] | None
    classes: tuple[str, ...]

    @property
    def source(self) -> str:
        return str(self.path)

    def payloads(self) -> list[tuple[str, np.ndarray, str]]:
        """Per sentence, what a client sends: (input name, array, Triton datatype)."""
        return [(TEXT_INPUT, np.array([[t.encode("utf-8")]], dtype=object), "BYTES") for t in self.texts]

    def names(self) -> list[str]:
        return [t if len(t) <= 60 else t[:57] + "…" for t in self.texts]


def is_text_file(path: Path) -> bool:
    """Whether ``path`` is a text file of sentences (``.csv`` with a ``text`` column, or ``.txt``, one per line)."""
    return Path(path).is_file() and Path(path).suffix.lower() in TEXT_SUFFIXES


def text_samples(path: Path, class_names: list[str] | None = None) -> TextSamples:
    """The sentences of ``path``: a CSV with a header naming ``text`` (and ``label``: a class index, or a line of
    ``class_names``), or a ``.txt`` file, one unlabeled sentence per line. PipelineError (one line) when it has none,
    or a label that names no class."""
    import csv

    path = Path(path)
    require(path.is_file(), f"text file {path} does not exist", "pass a .csv with text,label columns or a .txt, one sentence per line")
    names = list(class_names or ())
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (spreadsheet exports) is not part of the header
    except UnicodeDecodeError as exc:
        raise PipelineError(f"{path} is not UTF-8 text (byte {exc.start})", "save it as UTF-8") from None
    if path.suffix.lower() == ".txt":
        texts = tuple(line for line in text.splitlines() if line.strip())
        labels: tuple[int, ...] | None = None
    else:
        import io

        rows = list(csv.DictReader(io.StringIO(text)))
        require(bool(rows) and "text" in rows[0], f"{path} has no 'text' column (its header: {', '.join(rows[0]) if rows else 'none'})",
                "write a header line: text,label")
        texts = tuple(row["text"] or "" for row in rows)
        labels = tuple(_label(row.get("label"), names, path) for row in rows) if "label" in rows[0] else None
    require(bool(texts), f"{path} holds no sentence", "add one sentence per line (or CSV row)")
    if labels is not None and names:
        wrong = next((label for label in labels if not 0 <= label < len(names)), None)
        require(wrong is None, f"label {wrong} in {path} names no class of the {len(names)} in labels.txt",
                f"use class indices 0 to {len(names) - 1}, or the class names")
    return TextSamples(path, texts, labels, tuple(names))


def _label(value: str | None, names: list[str], path: Path) -> int:
    text = (value or "").strip()
    if text in names:
        return names.index(text)
    if text.lstrip("-").isdigit():
        return int(text)
    raise PipelineError(f"label {text!r} in {path} is neither a class index nor a class of labels.txt", "use the class index or its name")


def is_image_folder(path: Path) -> bool:
    """Whether ``path`` is a folder holding images (directly or one level down)."""
    path = Path(path)
    return path.is_dir() and any(_image(p) for p in [*path.iterdir(), *path.glob("*/*")])


def image_files(folder: Path, class_names: list[str] | None = None) -> ImageFiles:
    """The images of ``folder``: ``folder/<class>/*.png|jpg`` labeled by their sub-folder, or ``folder/*`` unlabeled.

    A sub-folder's class is its position in ``class_names`` (the model's ``labels.txt``) when given, else in the
    sorted sub-folder names. Hidden files and folders (``.x``, ``__MACOSX``) are not read. PipelineError (one line)
    for an empty folder, images beside class sub-folders, or a sub-folder naming no known class."""
    folder = Path(folder)
    require(folder.is_dir(), f"image folder {folder} does not exist", "pass a folder of JPEG/PNG files, or one sub-folder per class")
    subdirs = sorted((p for p in folder.iterdir() if p.is_dir() and not _hidden(p)), key=lambda p: p.name)
    loose = sorted(p for p in folder.iterdir() if _image(p))
    if subdirs:
        require(not loose, f"{folder} holds both images ({loose[0].name if loose else ''}, …) and sub-folders ({subdirs[0].name}, …)",
                "put every image in its class's sub-folder (the ImageFolder layout), or use a folder of images alone")
        names = list(class_names) if class_names else [d.name for d in subdirs]
        unknown = [d.name for d in subdirs if d.name not in names]
        if unknown:
            raise PipelineError(f"sub-folders {unknown[:3]} of {folder} name no class of the model's labels ({', '.join(names[:5])}, …)",
                                "name each sub-folder after a line of labels.txt (a folder per class, images inside: the ImageFolder layout)")
        pairs = [(f, names.index(d.name)) for d in subdirs for f in sorted(d.iterdir()) if _image(f)]
        result = ImageFiles(folder, tuple(p for p, _ in pairs), tuple(label for _, label in pairs), tuple(names))
    else:
        result = ImageFiles(folder, tuple(loose), None, tuple(class_names or ()))
    require(bool(result.files), f"{folder} holds no JPEG or PNG file{' in its sub-folders' if subdirs else ''}",
            "add images: <folder>/<class>/*.jpg (the ImageFolder layout), or <folder>/*.jpg without labels")
    return result


def _hidden(path: Path) -> bool:
    return path.name.startswith((".", "__MACOSX"))


def _image(path: Path) -> bool:
    """A JPEG/PNG file to read: not a hidden file or a macOS resource fork (``._x.jpg``)."""
    return path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES and not _hidden(path)


def preprocess_of(path: Path) -> ImagePreprocess:
    """The preprocessing a graph written by :func:`image_preprocess_onnx` records."""
    import onnx

    model = onnx.load(str(path))
    meta = {p.key: p.value for p in model.metadata_props}
    if SPEC_KEY not in meta:
        raise PipelineError(f"{path} records no image preprocessing", "rebuild it with build --raw-inputs image")
    return ImagePreprocess.from_json(meta[SPEC_KEY])


def fitted_image(image, out_height: int, out_width: int, fit: str, resample: str = "bilinear"):  # type: ignore[no-untyped-def]
    """The PIL ``image`` brought to the aspect ratio of ``out_width``×``out_height`` by ``fit`` (stretch, crop: the centre,
    pad: black borders), then resized to it with PIL's filter ``resample``, as ``keras.utils.load_img`` resizes
    (its ``keep_aspect_ratio`` is the centre crop)."""
    from PIL import Image

    width, height = image.size
    target = out_width / out_height
    if fit == "crop" and width and height:
        # keras.utils.load_img(keep_aspect_ratio=True)'s box: floor division, then the centre
        new_w = min(width, height * out_width // out_height)
        new_h = min(height, width * out_height // out_width)
        left, top = (width - new_w) // 2, (height - new_h) // 2
        # resized from the box, not cropped first: the filter reads the pixels around the box's edges, as Keras's does
        return image.resize((out_width, out_height), getattr(Image.Resampling, resample.upper()), box=(left, top, left + new_w, top + new_h))
    elif fit == "pad" and width and height:
        if width / height > target:
            canvas = Image.new(image.mode, (width, max(height, round(width / target))))
        else:
            canvas = Image.new(image.mode, (max(width, round(height * target)), height))
        canvas.paste(image, ((canvas.size[0] - width) // 2, (canvas.size[1] - height) // 2))
        image = canvas
    return image.resize((out_width, out_height), getattr(Image.Resampling, resample.upper()))


def keras_resized(pixels: np.ndarray, out_height: int, out_width: int, fit: str) -> np.ndarray:
    """``pixels`` (float32 HW or HWC) fitted and resized as ``keras.utils.image_dataset_from_directory`` does
    (``tf.image.resize`` bilinear, half-pixel centres, no antialiasing): stretch; crop = ``smart_resize``'s centre box, then
    the resize; pad = ``tf.image.resize_with_pad`` (shrunk to fit by the larger ratio, then black borders). In NumPy,
    float32 as TensorFlow computes it: the build needs no TensorFlow for it."""
    height, width = pixels.shape[:2]
    if fit == "crop":
        crop_h = max(min(height, int(float(width * out_height) / out_width)), 1)
        crop_w = max(min(width, int(float(height * out_width) / out_height)), 1)
        top, left = int(float(height - crop_h) / 2), int(float(width - crop_w) / 2)
        return _bilinear(pixels[top:top + crop_h, left:left + crop_w], out_height, out_width)
    if fit == "pad":
        ratio = max(np.float32(width) / np.float32(out_width), np.float32(height) / np.float32(out_height))
        inner_h, inner_w = np.float32(height) / ratio, np.float32(width) / ratio
        new_h, new_w = int(np.floor(inner_h)), int(np.floor(inner_w))
        if new_h < 1 or new_w < 1:  # tf.image.resize_with_pad refuses it too (output dimensions must be positive)
            raise ValueError(f"a {width}×{height} image shrinks to nothing when padded to {out_width}×{out_height}")
        top = max(0, int(np.floor((np.float32(out_height) - inner_h) / np.float32(2))))
        left = max(0, int(np.floor((np.float32(out_width) - inner_w) / np.float32(2))))
        canvas = np.zeros((out_height, out_width) + pixels.shape[2:], np.float32)
        canvas[top:top + new_h, left:left + new_w] = _bilinear(pixels, new_h, new_w)
        return canvas
    return _bilinear(pixels, out_height, out_width)


def _bilinear(pixels: np.ndarray, out_height: int, out_width: int) -> np.ndarray:
    """TensorFlow's ResizeBilinear with half-pixel centres (source = (i + ½)·in/out − ½, edges clamped)."""
    def weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        source = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * np.float32(in_size / out_size) - np.float32(0.5)
        floor = np.floor(source)
        return (np.maximum(floor, 0).astype(np.int64), np.minimum(np.ceil(source), in_size - 1).astype(np.int64),
                (source - floor).astype(np.float32))

    pixels = np.asarray(pixels, np.float32)
    y0, y1, dy = weights(pixels.shape[0], out_height)
    x0, x1, dx = weights(pixels.shape[1], out_width)
    extra = (1,) * (pixels.ndim - 2)
    dx = dx.reshape((1, -1) + extra)
    top = pixels[y0][:, x0] + (pixels[y0][:, x1] - pixels[y0][:, x0]) * dx
    bottom = pixels[y1][:, x0] + (pixels[y1][:, x1] - pixels[y1][:, x0]) * dx
    return (top + (bottom - top) * dy.reshape((-1, 1) + extra)).astype(np.float32)


def reference_tensor(path: Path, pre: ImagePreprocess) -> np.ndarray:
    """What Keras's own image utilities make of the file at ``path`` for ``pre``'s model input: PIL decodes it and
    converts it to grayscale or RGB (``keras.utils.load_img``), it is fitted and resized by ``pre``'s filter
    (:data:`RESIZE_FILTERS`), float32 as ``img_to_array`` gives, and ``pre``'s scale applies; one sample in the input's
    layout (no batch axis)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            converted = opened.convert("L" if pre.channels == 1 else "RGB")
            if pre.interpolation == "bilinear":
                pixels = keras_resized(np.asarray(converted, np.float32), pre.height, pre.width, pre.fit)
            else:
                pixels = np.asarray(fitted_image(converted, pre.height, pre.width, pre.fit, pre.interpolation.removeprefix("pil-")), np.float32)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise PipelineError(f"cannot read image '{path}': {exc}", "remove or replace the file") from None
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    pixels = pixels * np.asarray(pre.scale, np.float32) + np.asarray(pre.offset, np.float32)
    return np.transpose(pixels, (2, 0, 1)) if pre.channels_first else pixels
