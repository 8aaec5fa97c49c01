"""scripts/bench_raw.py's bytes per request, measured from the load generator's own pre-encoded requests (no server)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pipeline.loadtest.client import Endpoint, post_request_bytes
from pipeline.loadtest.payload import ModelIO, TensorInfo, encode

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_raw.py"


def _bench_raw():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_raw", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


IO = ModelIO("tiny", (TensorInfo("x", "FP32", (4,)),), (TensorInfo("y", "FP32", (4,)),), 8)
RAW = ModelIO("raw", (TensorInfo("image_bytes", "BYTES", (1,)),), (TensorInfo("probs", "FP32", (1, 10)),), 0)


def _requests(io: ModelIO, batches: list[dict[str, np.ndarray]], encoding: str = "binary") -> list[bytes]:
    endpoint = Endpoint("127.0.0.1", 8000)
    return [post_request_bytes(endpoint, f"/v2/models/{io.name}/infer", *encode(io, b, encoding)) for b in batches]


def test_binary_tensor_requests_count_the_whole_request_its_body_and_the_tensor_bytes() -> None:
    requests = _requests(IO, [{"x": np.zeros((1, 4), np.float32)}, {"x": np.ones((3, 4), np.float32)}])
    sizes = _bench_raw().request_sizes(requests)
    assert sizes["data_bytes"] == (16 + 48) / 2  # float32: 4 values a row, rows 1 and 3
    bodies = [len(r) - r.index(b"\r\n\r\n") - 4 for r in requests]
    assert sizes["body_bytes"] == sum(bodies) / 2 and sizes["body_bytes"] > sizes["data_bytes"]  # the JSON header is in the body
    assert sizes["request_bytes"] == sum(map(len, requests)) / 2 and sizes["request_bytes"] > sizes["body_bytes"]
    assert sizes["distinct_requests"] == 2


def test_raw_file_requests_carry_the_files_bytes_as_they_are() -> None:
    files = [np.array([bytes(n)], dtype=object) for n in (100, 301)]
    sizes = _bench_raw().request_sizes(_requests(RAW, [{"image_bytes": f} for f in files]))
    assert sizes["data_bytes"] == 4 + (100 + 301) / 2  # one BYTES element: its 4-byte length, then the file


def test_json_requests_have_no_binary_part_and_a_wrong_content_length_is_refused() -> None:
    bench = _bench_raw()
    request = _requests(IO, [{"x": np.zeros((1, 4), np.float32)}], "json")[0]
    sizes = bench.request_sizes([request])
    assert sizes["data_bytes"] == sizes["body_bytes"] == len(request) - request.index(b"\r\n\r\n") - 4
    with pytest.raises(ValueError, match="Content-Length"):
        bench.request_sizes([request + b"x"])
