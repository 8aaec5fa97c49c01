"""A Triton Python model in front of the image decoder: lets through only files the decoder can take without harm.

onnxruntime-extensions' ``DecodeImage`` (0.15) hands libjpeg's fatal errors to libjpeg's default handler, which
calls ``exit()``: one malformed upload would end the server process that decodes it, tritonserver itself under NGC's
C++ onnxruntime backend (microsoft/onnxruntime-extensions issue #1094, open; fix proposed in PR #1096), and a JPEG
cut short made it loop (measured here). So the ensemble sends each file through this step first. It answers a
request with an error of its own, and the server goes on, when the file is

* not a PNG (signature, IHDR, IEND at the end) or a baseline/progressive JPEG (SOI, segments whose lengths stay
  inside the file, a frame header, scan headers naming only the components and tables defined before them, EOI at
  the end: what libjpeg refuses fatally is in these headers; damaged entropy-coded data it only warns about);
* larger than ``max_bytes`` or than ``max_pixels`` (width × height from the header: a decompression bomb);
* a 16-bit PNG, a CMYK JPEG or a grayscale (one-component) JPEG: the decoder reads those unlike PIL and Keras, so
  the answer would be wrong without an error (measured: a grayscale JPEG's bytes come out swapped in threes, as if
  converted from RGB to BGR, the last one written past the buffer; the others up to 252 grey levels apart).

A file that passes goes on unchanged (output ``image_checked``). Standard library and numpy only, so every NGC
Triton's Python backend runs it; the limits come from the config's ``parameters``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

INPUT_NAME = "image_bytes"
OUTPUT_NAME = "image_checked"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Frame headers libjpeg decodes (baseline, extended, progressive, lossless; Huffman and arithmetic); C4, C8 and CC
# are DHT, JPG and DAC.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


class Refused(ValueError):
    """The file is not one the decoder can take safely."""


def file_bytes(value: np.ndarray) -> bytes:
    """The one file of a request: a TYPE_STRING tensor of one element (the ensemble's input, ``[1]``)."""
    if value.dtype != np.object_ or value.size != 1:
        raise Refused(f"send one file as one BYTES element (shape [1]), not {value.dtype} of shape {list(value.shape)}")
    item = value.reshape(-1)[0]
    return bytes(item) if isinstance(item, (bytes, bytearray)) else str(item).encode("latin-1")


def check_image(data: bytes, max_bytes: int, max_pixels: int) -> tuple[str, int, int]:
    """("png" | "jpeg", width, height) of a file the decoder can take; Refused (its reason) otherwise."""
    if len(data) > max_bytes:
        raise Refused(f"the file is {len(data)} bytes, over the limit of {max_bytes}")
    if data.startswith(PNG_SIGNATURE):
        kind, (width, height) = "png", _png_size(data)
    elif data.startswith(b"\xff\xd8\xff"):
        kind, (width, height) = "jpeg", _jpeg_size(data)
    else:
        raise Refused(f"not a PNG or JPEG file (it starts with {data[:8].hex()})")
    if width <= 0 or height <= 0 or width * height > max_pixels:
        raise Refused(f"the image is {width}×{height}: outside 1 to {max_pixels} pixels")
    return kind, width, height


def _png_size(data: bytes) -> tuple[int, int]:
    if len(data) < 45 or data[12:16] != b"IHDR":
        raise Refused("a PNG file without its header (IHDR)")
    if data[-8:-4] != b"IEND":
        raise Refused("a PNG file cut short (no IEND chunk at its end)")
    width, height = struct.unpack(">II", data[16:24])
    if data[24] == 16:
        raise Refused("a 16-bit PNG, which the decoder reads unlike PIL: save it with 8 bits per channel")
    return int(width), int(height)


def _jpeg_size(data: bytes) -> tuple[int, int]:
    if data.rstrip(b"\x00\n\r ")[-2:] != b"\xff\xd9":
        raise Refused("a JPEG file cut short (no end-of-image marker at its end)")
    position, size = 2, None
    components: set[int] = set()
    tables = {"quantization": set(), "dc": set(), "ac": set()}  # type: ignore[var-annotated]
    frame_tables: list[int] = []
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            raise Refused(f"a damaged JPEG file (no marker at byte {position})")
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            position += 2
            continue
        if marker == 0xD9:
            break
        length = struct.unpack(">H", data[position + 2:position + 4])[0]
        segment = data[position + 4:position + 2 + length]
        if length < 2 or position + 2 + length > len(data):
            raise Refused(f"a damaged JPEG file (a segment at byte {position} runs past the end)")
        if marker == 0xDB:
            _quantization_tables(segment, tables["quantization"])
        elif marker == 0xC4:
            _huffman_tables(segment, tables)
        elif marker in _SOF:
            if len(segment) < 6 or segment[5] * 3 + 6 != len(segment) or segment[5] not in (1, 3, 4):
                raise Refused("a damaged JPEG file (its frame header)")
            if segment[5] == 4:
                raise Refused("a CMYK JPEG, which the decoder reads unlike PIL: save it as RGB")
            if segment[5] == 1:
                raise Refused("a grayscale (one-component) JPEG, whose bytes the decoder swaps in threes as if they were BGR "
                              "(and writes one past its buffer): save it as an RGB JPEG or a PNG")
            height, width = struct.unpack(">HH", segment[1:5])
            size = (int(width), int(height))
            components = {segment[6 + 3 * i] for i in range(segment[5])}
            frame_tables = [segment[8 + 3 * i] for i in range(segment[5])]
        elif marker == 0xDA:
            _check_scan(segment, size, components, frame_tables, tables, progressive=data.find(b"\xff\xc2", 0, position) >= 0)
            position = _after_entropy_data(data, position + 2 + length)
            continue
        position += 2 + length
    if size is None:
        raise Refused("a JPEG file without a frame header")
    return size


def _quantization_tables(segment: bytes, defined: set[int]) -> None:
    at = 0
    while at < len(segment):
        precision, table = segment[at] >> 4, segment[at] & 0x0F
        if precision > 1 or table > 3:
            raise Refused("a damaged JPEG file (a quantization table)")
        defined.add(table)
        at += 1 + 64 * (precision + 1)
    if at != len(segment):
        raise Refused("a damaged JPEG file (a quantization table's length)")


def _huffman_tables(segment: bytes, tables: dict[str, set[int]]) -> None:
    at = 0
    while at + 17 <= len(segment):
        kind, table = segment[at] >> 4, segment[at] & 0x0F
        if kind > 1 or table > 3:
            raise Refused("a damaged JPEG file (a Huffman table)")
        count = sum(segment[at + 1:at + 17])
        if count > 256:
            raise Refused("a damaged JPEG file (a Huffman table's codes)")
        tables["ac" if kind else "dc"].add(table)
        at += 17 + count
    if at != len(segment):
        raise Refused("a damaged JPEG file (a Huffman table's length)")


def _check_scan(segment: bytes, size: tuple[int, int] | None, components: set[int], frame_tables: list[int],
                tables: dict[str, set[int]], progressive: bool) -> None:
    if size is None:
        raise Refused("a damaged JPEG file (a scan before its frame header)")
    if not set(frame_tables) <= tables["quantization"]:
        raise Refused("a damaged JPEG file (a component's quantization table is not defined)")
    if not segment or len(segment) != 1 + 2 * segment[0] + 3:
        raise Refused("a damaged JPEG file (a scan header)")
    for i in range(segment[0]):
        component, selectors = segment[1 + 2 * i], segment[2 + 2 * i]
        if component not in components:
            raise Refused("a damaged JPEG file (a scan names a component the frame has not)")
        dc, ac = selectors >> 4, selectors & 0x0F
        # a progressive scan uses only the tables of its own pass; a sequential one both
        if not progressive and (dc not in tables["dc"] or ac not in tables["ac"]):
            raise Refused("a damaged JPEG file (a scan names a Huffman table that is not defined)")


def _after_entropy_data(data: bytes, position: int) -> int:
    """The position of the next marker after a scan's entropy-coded data (FF 00 is data, FF D0-D7 restarts)."""
    while True:
        found = data.find(b"\xff", position)
        if found < 0 or found + 1 >= len(data):
            raise Refused("a JPEG file cut short (its scan has no end)")
        following = data[found + 1]
        if following == 0x00 or 0xD0 <= following <= 0xD7 or following == 0xFF:
            position = found + 1
            continue
        return found


class TritonPythonModel:
    """One instance: the limits read once, then each request's file checked."""

    def initialize(self, args: dict[str, str]) -> None:
        """Read ``max_bytes`` and ``max_pixels`` from the config's parameters."""
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        self._max_bytes = int(parameters.get("max_bytes", {}).get("string_value", 64 << 20))
        self._max_pixels = int(parameters.get("max_pixels", {}).get("string_value", 64 << 20))

    def execute(self, requests: list[Any]) -> list[Any]:
        """One response per request: the file unchanged, or its own error."""
        responses = []
        for request in requests:
            try:
                tensor = pb_utils.get_input_tensor_by_name(request, INPUT_NAME)
                if tensor is None:
                    raise Refused(f"the request has no input '{INPUT_NAME}'")
                data = file_bytes(tensor.as_numpy())
                check_image(data, self._max_bytes, self._max_pixels)
                array = np.frombuffer(data, np.uint8)
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(OUTPUT_NAME, array)]))
            except Exception as exc:  # noqa: BLE001 - one bad file must not fail the others or the model
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"image refused: {exc}")))
        return responses

    def finalize(self) -> None:
        """Nothing to release."""
