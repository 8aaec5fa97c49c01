"""Request bodies from samples: batching, dtype casts, JSON and binary encodings.

The binary body is decoded with tritonclient's own request parser-free path: we rebuild the
tensors from the header's ``binary_data_size`` fields, as Triton does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.loadtest.payload import (
    ModelIO,
    TensorInfo,
    encode_binary,
    encode_json,
    eval_data_path,
    request_batches,
)

IO = ModelIO("m", (TensorInfo("image", "FP16", (2, 2)), TensorInfo("ids", "INT64", (3,))), (TensorInfo("probs", "FP32", (10,)),), 8)


def samples(n: int = 5) -> dict[str, np.ndarray]:
    return {
        "image": np.arange(n * 4, dtype=np.float32).reshape(n, 2, 2),
        "ids": np.arange(n * 3, dtype=np.int32).reshape(n, 3),
        "labels": np.zeros(n, dtype=np.int64),
    }


def test_batches_wrap_around_and_cast() -> None:
    batches = request_batches(samples(5), IO, batch_size=3, count=2)
    assert batches[0]["image"].dtype == np.float16 and batches[0]["ids"].dtype == np.int64
    assert batches[0]["ids"][:, 0].tolist() == [0, 3, 6]  # samples 0,1,2
    assert batches[1]["ids"][:, 0].tolist() == [9, 12, 0]  # samples 3,4,0


def test_batch_errors() -> None:
    with pytest.raises(PipelineError, match="max_batch_size"):
        request_batches(samples(), IO, batch_size=9, count=1)
    with pytest.raises(PipelineError, match="no array for input"):
        request_batches({"image": samples()["image"]}, IO, batch_size=1, count=1)
    wrong = samples()
    wrong["image"] = np.zeros((5, 3, 2), dtype=np.float32)
    with pytest.raises(PipelineError, match="shape"):
        request_batches(wrong, IO, batch_size=1, count=1)


def test_non_batching_model_gets_one_sample_per_request() -> None:
    io = ModelIO("m", (TensorInfo("ids", "INT64", (3,)),), (), 0)
    batch = request_batches(samples(), io, batch_size=1, count=2)[1]
    assert batch["ids"].shape == (3,) and batch["ids"].tolist() == [3, 4, 5]
    with pytest.raises(PipelineError, match="does not batch"):
        request_batches(samples(), io, batch_size=2, count=1)


def test_json_body() -> None:
    batch = request_batches(samples(), IO, batch_size=2, count=1)[0]
    body = json.loads(encode_json(IO, batch))
    image = body["inputs"][0]
    assert image == {"name": "image", "shape": [2, 2, 2], "datatype": "FP16", "data": [float(v) for v in range(8)]}
    assert "outputs" not in body


def test_binary_body_layout() -> None:
    batch = request_batches(samples(), IO, batch_size=2, count=1)[0]
    body, header_length = encode_binary(IO, batch)
    header = json.loads(body[:header_length])
    assert header["outputs"] == [{"name": "probs", "parameters": {"binary_data": True}}]
    offset = header_length
    for spec, info in zip(header["inputs"], IO.inputs):
        size = spec["parameters"]["binary_data_size"]
        decoded = np.frombuffer(body[offset : offset + size], dtype=batch[info.name].dtype.newbyteorder("<"))
        np.testing.assert_array_equal(decoded.reshape(spec["shape"]), batch[info.name])
        offset += size
    assert offset == len(body)


def test_eval_data_path_for_variants(tmp_path: Path) -> None:
    (tmp_path / "digits").mkdir()
    (tmp_path / "digits" / "eval.npz").write_bytes(b"")
    assert eval_data_path("digits_int8_trt", tmp_path) == tmp_path / "digits" / "eval.npz"
    assert eval_data_path("digits_fp16", tmp_path) == tmp_path / "digits" / "eval.npz"
    with pytest.raises(PipelineError, match="no evaluation samples"):
        eval_data_path("other_fp32", tmp_path)


def test_raw_inputs_as_clients_send_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A raw-input ensemble's requests: one image file's bytes (UINT8 [-1]), or sentences as BYTES ([batch, 1]), whose
    binary body is Triton's (a 4-byte little-endian length before each string, as tritonclient serializes them)."""
    from PIL import Image
    from tritonclient.utils import serialize_byte_tensor

    from pipeline.loadtest.payload import ModelIO, TensorInfo, encode_binary, encode_json, raw_file_requests, raw_text_requests

    (tmp_path / "cat").mkdir()
    Image.new("RGB", (5, 4), (200, 10, 10)).save(tmp_path / "cat" / "a.png")
    image_io = ModelIO("digits", (TensorInfo("image_bytes", "BYTES", (1,)),), (TensorInfo("probs", "FP32", (1, 10)),), 0)
    requests = raw_file_requests(tmp_path, image_io, 3)
    assert len(requests) == 3 and requests[0]["image_bytes"][0] == (tmp_path / "cat" / "a.png").read_bytes()

    csv = tmp_path / "s.csv"
    csv.write_text('text,label\n"Hello, world!",0\nCafé naïve,1\n', encoding="utf-8")
    text_io = ModelIO("bert", (TensorInfo("text", "BYTES", (1,)),), (TensorInfo("logits", "FP32", (4,)),), 64)
    batch = raw_text_requests(csv, text_io, 3, 1)[0]["text"]
    assert batch.shape == (3, 1) and [v[0].decode() for v in batch] == ["Hello, world!", "Café naïve", "Hello, world!"]
    body, head = encode_binary(text_io, {"text": batch})
    assert body[head:] == serialize_byte_tensor(batch).item()
    assert b'"binary_data_size":%d' % len(body[head:]) in body[:head]
    assert json.loads(encode_json(text_io, {"text": batch}))["inputs"][0]["data"] == ["Hello, world!", "Café naïve", "Hello, world!"]
    with pytest.raises(PipelineError, match="does not take raw text"):
        raw_text_requests(csv, image_io, 1, 1)


def test_image_files_over_grpc_are_their_bytes_and_json_refuses_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """gRPC carries one BYTES element as its 4-byte length and the file (not the object array's pointers); JSON cannot
    carry a file that is not UTF-8 text and says so in one line."""
    from PIL import Image
    from tritonclient.grpc import service_pb2

    from pipeline.core.errors import PipelineError
    from pipeline.loadtest.grpc_load import grpc_request_bytes
    from pipeline.loadtest.payload import ModelIO, TensorInfo, encode_json, raw_file_requests

    (tmp_path / "cat").mkdir()
    Image.new("RGB", (5, 4), (200, 10, 10)).save(tmp_path / "cat" / "a.png")
    io = ModelIO("digits", (TensorInfo("image_bytes", "BYTES", (1,)),), (TensorInfo("probs", "FP32", (1, 10)),), 0)
    [request] = raw_file_requests(tmp_path, io, 1)
    data = (tmp_path / "cat" / "a.png").read_bytes()
    parsed = service_pb2.ModelInferRequest.FromString(grpc_request_bytes(io, request))
    assert parsed.raw_input_contents[0] == len(data).to_bytes(4, "little") + data and parsed.inputs[0].datatype == "BYTES"
    with pytest.raises(PipelineError, match="--encoding json cannot carry input 'image_bytes': its BYTES are not UTF-8 text"):
        encode_json(io, request)
