"""HTTP plumbing: addresses, request bytes, response framing."""

from __future__ import annotations

import re

import pytest

from pipeline.core.errors import PipelineError
from pipeline.loadtest.client import (
    Endpoint,
    endpoint_from_url,
    post_request_bytes,
    response_frame,
)


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [("127.0.0.1:8000", Endpoint("127.0.0.1", 8000)), ("http://localhost:9", Endpoint("localhost", 9)),
     ("grpc://[::1]:8001", Endpoint("::1", 8001))],
)  # fmt: skip
def test_endpoint_from_url(url: str, endpoint: Endpoint) -> None:
    assert endpoint_from_url(url) == endpoint


@pytest.mark.parametrize(
    ("url", "problem"),
    [("localhost", "names no port"), ("http://h:x", "names no port"), ("ftp://h:1", "is not a server address"),
     ("http://h:1/v2", "is not a server address")],
)  # fmt: skip
def test_bad_urls_are_user_errors(url: str, problem: str) -> None:
    with pytest.raises(PipelineError, match=f"^'{re.escape(url)}' {problem} — pass --url HOST:PORT"):
        endpoint_from_url(url)


def test_post_request_bytes_with_binary_header() -> None:
    raw = post_request_bytes(Endpoint("127.0.0.1", 8000), "/v2/models/m/infer", b'{"a":1}BIN', json_header_length=7)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert body == b'{"a":1}BIN'
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v2/models/m/infer HTTP/1.1"
    assert "Content-Length: 10" in lines and "Inference-Header-Content-Length: 7" in lines


def test_response_frame_incremental_and_case_insensitive() -> None:
    full = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\nhello"
    assert response_frame(full[:20]) is None
    start, end = response_frame(full)  # type: ignore[misc]
    assert full[start:end] == b"hello"
    partial = full[:-2]
    assert response_frame(partial) == (start, end) and len(partial) < end  # head known, body incomplete
    exact = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    assert exact[slice(*response_frame(exact))] == b"{}"  # type: ignore[misc]


def test_response_without_content_length_is_rejected() -> None:
    with pytest.raises(ValueError, match="response has no Content-Length"):
        response_frame(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
