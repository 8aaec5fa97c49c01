"""The image guard in front of the decoder (pipeline/triton/python_models/image_guard/): which files it lets through,
and which it refuses with a reason, since onnxruntime-extensions' DecodeImage ends the process on libjpeg's fatal
errors (microsoft/onnxruntime-extensions#1094). Served end to end in tests/build/test_raw_inputs.py."""

from __future__ import annotations

import importlib.util
import io
import sys
import types

import numpy as np
import pytest
from PIL import Image

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def guard():  # type: ignore[no-untyped-def]
    """The model file as the stub imports it (its backend utilities stood in: only check_image is exercised)."""
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
    try:
        spec = importlib.util.spec_from_file_location("image_guard_model", ROOT / "pipeline" / "triton" / "python_models" / "image_guard" / "model.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        yield module
    finally:
        if saved is None:
            sys.modules.pop("triton_python_backend_utils", None)
        else:
            sys.modules["triton_python_backend_utils"] = saved


def _encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


PICTURE = Image.fromarray((np.random.default_rng(0).random((40, 50, 3)) * 255).astype(np.uint8))


@pytest.mark.parametrize("name, data", [
    ("png", _encoded(PICTURE, "PNG")), ("grayscale png", _encoded(PICTURE.convert("L"), "PNG")),
    ("rgba png", _encoded(PICTURE.convert("RGBA"), "PNG")), ("palette png", _encoded(PICTURE.convert("P"), "PNG")),
    ("jpeg", _encoded(PICTURE, "JPEG", quality=90)), ("progressive jpeg", _encoded(PICTURE, "JPEG", progressive=True)),
    ("optimized 4:4:4 jpeg", _encoded(PICTURE, "JPEG", optimize=True, subsampling=0)),
])
def test_files_the_decoder_takes_pass(guard, name: str, data: bytes) -> None:  # type: ignore[no-untyped-def]
    assert guard.check_image(data, 1 << 26, 1 << 26)[1:] == (50, 40), name


def _bad_quantization_table(data: bytes) -> bytes:
    damaged = bytearray(data)
    at = damaged.find(b"\xff\xdb")
    damaged[at + 4] = 0x03  # the table is defined as 3; the frame's components use 0
    return bytes(damaged)


JPEG = _encoded(PICTURE, "JPEG", quality=90)


@pytest.mark.parametrize("data, reason", [
    (JPEG[:200], "cut short"), (JPEG[:-100], "cut short"), (_encoded(PICTURE, "PNG")[:-30], "cut short"),
    (b"GIF89a" + bytes(100), "not a PNG or JPEG"), (bytes(np.random.default_rng(1).integers(0, 256, 500, dtype=np.uint8)), "not a PNG or JPEG"),
    (_bad_quantization_table(JPEG), "quantization table is not defined"),
    (_encoded(PICTURE.convert("CMYK"), "JPEG"), "CMYK"), (_encoded(PICTURE.convert("L"), "JPEG"), "grayscale .*JPEG"),
    (_encoded(Image.fromarray(np.full((4, 5), 40000, np.uint16)), "PNG"), "16-bit"),
])
def test_files_that_would_harm_or_mislead_are_refused(guard, data: bytes, reason: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(guard.Refused, match=reason):
        guard.check_image(data, 1 << 26, 1 << 26)


def test_limits(guard) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(guard.Refused, match="over the limit of 100"):
        guard.check_image(JPEG, 100, 1 << 26)
    with pytest.raises(guard.Refused, match="outside 1 to 1000 pixels"):
        guard.check_image(JPEG, 1 << 26, 1000)


def test_one_file_is_one_string_element(guard) -> None:  # type: ignore[no-untyped-def]
    """The ensemble's input is TYPE_STRING [1]: the element's bytes come through whole; a uint8 array (the bytes as
    numbers) or several files in one request are refused, saying how to send one."""
    png = b"\x89PNG\r\n\x1a\n" + bytes(40)
    assert guard.file_bytes(np.array([png], dtype=object)) == png
    for wrong in (np.frombuffer(png, np.uint8), np.array([png, png], dtype=object)):
        with pytest.raises(guard.Refused, match=r"send one file as one BYTES element \(shape \[1\]\)"):
            guard.file_bytes(wrong)
