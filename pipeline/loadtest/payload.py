"""Request bodies from real evaluation samples, encoded once before the load starts.

Samples come from ``calibration/<model>/eval.npz`` (one array per input name, first axis =
sample). Two encodings of the KServe v2 inference request:

- ``json``: tensors as JSON number lists — what a plain client sends; the server parses text.
- ``binary``: Triton's binary tensor data extension — a small JSON header followed by the raw
  little-endian tensor bytes (``Inference-Header-Content-Length`` says where the header ends),
  with outputs requested as binary too. Less work on both sides, so the server is measured
  rather than its JSON parser.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError, require

ENCODINGS = ("binary", "json")

NUMPY_OF = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}



@dataclass(frozen=True)
class TensorInfo:
    """One model input or output as Triton reports it (``shape`` excludes the batch axis when
    the model batches; -1 is a dynamic dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelIO:
    """What a served model takes and returns."""

    name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    max_batch_size: int


def eval_data_path(model: str, calibration_dir: Path, repository: Path | None = None) -> Path:
    """The samples for ``model``: what its build recorded in ``repository`` (``--eval-data``), else
    ``<calibration_dir>/<model or its base model>/eval.npz`` (``digits_int8[_trt]`` reads ``digits``'s)."""
    from pipeline.data.artifacts import parse_variant
    from pipeline.data.workspace import ModelData, eval_data_of_served

    found = eval_data_of_served(Path(repository or ".") / model, calibration_dir)
    if found is None:
        looked = ModelData.of(calibration_dir, (parse_variant(model) or (model, ""))[0]).eval
        raise PipelineError(
            f"no evaluation samples for model '{model}' (none recorded by its build, no {looked})",
            "pass --data PATH.npz with one array per input name (a build given --eval-data records it for later commands)",
        )
    return found


def load_samples(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file or a folder of ``.npy`` files (no pickles; a damaged file or an array that is not
    numbers is one PipelineError), read as the build reads its data (:func:`pipeline.data.buckets.read_arrays`)."""
    from pipeline.data.buckets import read_arrays

    arrays = read_arrays(Path(path))
    require(bool(arrays), f"'{path}' holds no arrays", "write one array per model input name with numpy.savez")
    from pipeline.data.arrays import is_label_key

    for key, array in arrays.items():
        require(is_label_key(key) or array.dtype.kind in "biuf", f"array '{key}' in '{path}' holds {array.dtype} values, not numbers",
                "store numeric arrays (e.g. x.astype(np.float32)) with numpy.savez")
        if array.dtype.kind == "f" and not is_label_key(key):
            bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
            require(not bad, f"array '{key}' in '{path}' has {bad} NaN/Inf value(s)", "replace or drop the samples with NaN/Inf (check the preprocessing)")
    return arrays


def raw_file_requests(folder: Path, io: ModelIO, count: int) -> list[dict[str, np.ndarray]]:
    """``count`` requests of a raw-input ensemble (one TYPE_STRING [1] input, ``max_batch_size`` 0), one image file each,
    the files of ``folder`` (and its class sub-folders) taken in turn: the bytes a client sends, as they are on disk."""
    from pipeline.data.raw_files import image_files

    inputs = [t for t in io.inputs]
    require(len(inputs) == 1 and inputs[0].datatype == "BYTES" and list(inputs[0].shape) == [1] and io.max_batch_size == 0,
            f"--data {folder} is a folder of images, and model '{io.name}' does not take one encoded file per request (BYTES [1])",
            "load-test the raw-input ensemble (build --raw-inputs image), or pass an .npz of tensors")
    files = image_files(folder).files
    return [{inputs[0].name: np.array([files[k % len(files)].read_bytes()], dtype=object)} for k in range(count)]


def raw_text_requests(path: Path, io: ModelIO, batch_size: int, count: int) -> list[dict[str, np.ndarray]]:
    """``count`` requests of a text ensemble (one TYPE_STRING input ``text``, ``[batch, 1]``), ``batch_size`` sentences
    each, the sentences of the CSV or text file ``path`` taken in turn (UTF-8 bytes, as a client sends them)."""
    from pipeline.data.raw_files import TEXT_INPUT, text_samples

    inputs = list(io.inputs)
    require(len(inputs) == 1 and inputs[0].name == TEXT_INPUT and inputs[0].datatype == "BYTES",
            f"--data {path} holds sentences, and model '{io.name}' does not take raw text (one BYTES input '{TEXT_INPUT}')",
            "load-test the text ensemble (build --raw-inputs text), or pass an .npz of tensors")
    require(io.max_batch_size == 0 or batch_size <= io.max_batch_size,
            f"--batch-size {batch_size} exceeds model '{io.name}''s max_batch_size {io.max_batch_size}", "use a smaller --batch-size")
    texts = text_samples(path).texts
    return [{TEXT_INPUT: np.array([[texts[(k * batch_size + j) % len(texts)].encode("utf-8")] for j in range(batch_size)], dtype=object)}
            for k in range(count)]


def request_batches(samples: dict[str, np.ndarray], io: ModelIO, batch_size: int, count: int) -> list[dict[str, np.ndarray]]:
    """``count`` request batches of ``batch_size`` consecutive samples (wrapping around), each
    input cast to the dtype the model declares. Samples in length buckets (``tokens__16``,
    ``tokens__20``: see :mod:`pipeline.data.buckets`) are sent at their real sizes, the requests
    taking the buckets in turn."""
    from pipeline.data.buckets import split_buckets
    from pipeline.data.tensors import ModelSignature, TensorSpec

    names = ModelSignature(tuple(TensorSpec(t.name, np.dtype(NUMPY_OF.get(t.datatype, np.float32)), (-1, *t.shape)) for t in io.inputs), ())
    missing = [t.name for t in io.inputs if not any(k == t.name or k.startswith(t.name + "__") for k in samples)]
    if missing:
        raise PipelineError(
            f"the samples have no array for input(s) {', '.join(missing)} of model '{io.name}' (arrays: {', '.join(sorted(samples))})",
            "write the evaluation .npz with one array per model input name",
        )
    known = {k: v for k, v in samples.items() if any(k == t.name or k.startswith(t.name + "__") for t in io.inputs)}
    buckets = list(split_buckets(Path("the samples"), known, names, what="load-test samples").values())
    per_bucket = [_bucket_batches(b, io, batch_size, -(-count // len(buckets))) for b in buckets]
    return [per_bucket[k % len(buckets)][k // len(buckets)] for k in range(count)]


def _bucket_batches(samples: dict[str, np.ndarray], io: ModelIO, batch_size: int, count: int) -> list[dict[str, np.ndarray]]:
    if io.max_batch_size > 0 and batch_size > io.max_batch_size:
        raise PipelineError(
            f"--batch-size {batch_size} exceeds model '{io.name}''s max_batch_size {io.max_batch_size}",
            f"use --batch-size {io.max_batch_size} or less",
        )
    missing = [t.name for t in io.inputs if t.name not in samples]
    if missing:
        raise PipelineError(
            f"the samples have no array for input(s) {', '.join(missing)} of model '{io.name}' "
            f"(arrays: {', '.join(sorted(samples))})",
            "write the evaluation .npz with one array per model input name",
        )
    n = min(len(samples[t.name]) for t in io.inputs)
    if n == 0:
        raise PipelineError(f"the samples for model '{io.name}' are empty", "write at least one sample per input")
    # A model without Triton batching (max_batch_size 0) takes its full shape: one sample per
    # request when that shape has no leading batch axis, else the batch axis is the model's own.
    single = io.max_batch_size == 0 and all(len(t.shape) == samples[t.name].ndim - 1 for t in io.inputs)
    if single and batch_size != 1:
        raise PipelineError(
            f"model '{io.name}' does not batch (max_batch_size 0 and no batch axis)", "use --batch-size 1"
        )
    batches = []
    for k in range(count):
        rows = [(k * batch_size + j) % n for j in range(batch_size)]
        batch = {}
        for t in io.inputs:
            dtype = NUMPY_OF.get(t.datatype)
            if dtype is None:
                raise PipelineError(f"input '{t.name}' has datatype {t.datatype}", "the load generator sends numeric tensors only")
            picked = samples[t.name][rows[0]] if single else samples[t.name][rows]
            array = np.ascontiguousarray(picked, dtype=dtype)
            _check_shape(io, t, array)
            batch[t.name] = array
        batches.append(batch)
    return batches


def _check_shape(io: ModelIO, info: TensorInfo, array: np.ndarray) -> None:
    expected = info.shape if io.max_batch_size == 0 else (-1, *info.shape)
    actual = array.shape
    if len(actual) != len(expected) or any(e not in (-1, a) for e, a in zip(expected, actual)):
        raise PipelineError(
            f"samples for input '{info.name}' have shape {list(actual)} per request but model '{io.name}' "
            f"takes {list(expected)} (-1 = any)",
            "use evaluation data written for this model (or check --batch-size)",
        )


def encode_json(io: ModelIO, tensors: dict[str, np.ndarray]) -> bytes:
    """A plain KServe v2 JSON request body; PipelineError (one line) for BYTES that are not UTF-8 text (an image file),
    which JSON cannot carry."""
    def text(name: str, value: object) -> object:
        if not isinstance(value, bytes):
            return value
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise PipelineError(f"--encoding json cannot carry input '{name}': its BYTES are not UTF-8 text (an image file, say)",
                                "use --encoding binary (the default), or --protocol grpc") from None

    body = {
        "inputs": [
            {"name": t.name, "shape": list(tensors[t.name].shape), "datatype": t.datatype,
             "data": [text(t.name, v) for v in tensors[t.name].ravel().tolist()]}
            for t in io.inputs
        ]
    }
    return json.dumps(body, separators=(",", ":")).encode()


def encode_binary(io: ModelIO, tensors: dict[str, np.ndarray]) -> tuple[bytes, int]:
    """A binary-tensor request body and the length of its JSON header."""
    data = [tensor_bytes(tensors[t.name]) for t in io.inputs]
    header = {
        "inputs": [
            {"name": t.name, "shape": list(tensors[t.name].shape), "datatype": t.datatype, "parameters": {"binary_data_size": len(raw)}}
            for t, raw in zip(io.inputs, data, strict=True)
        ],
        "outputs": [{"name": t.name, "parameters": {"binary_data": True}} for t in io.outputs],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + b"".join(data), len(head)


def tensor_bytes(array: np.ndarray) -> bytes:
    """The binary-data bytes of one tensor: little-endian numbers, or for BYTES (an object array of bytes) each element
    as a 4-byte little-endian length and its bytes, as Triton reads them."""
    if array.dtype == object:
        items = [v if isinstance(v, bytes) else str(v).encode() for v in array.ravel()]
        return b"".join(len(v).to_bytes(4, "little") + v for v in items)
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()


def encode(io: ModelIO, tensors: dict[str, np.ndarray], encoding: str) -> tuple[bytes, int | None]:
    """The body for ``encoding`` and, for ``binary``, the JSON header length."""
    if encoding == "json":
        return encode_json(io, tensors), None
    if encoding == "binary":
        return encode_binary(io, tensors)
    raise PipelineError(f"unknown --encoding '{encoding}'", f"use one of: {', '.join(ENCODINGS)}")
