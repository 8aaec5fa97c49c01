"""HTTP plumbing for the load generator: endpoints, pre-encoded requests, response framing, and
the small control-plane calls (health, metadata, statistics).

The load itself goes through :mod:`pipeline.loadtest.engine`; this module only builds the bytes
it sends and knows how to tell where a response ends (status line + ``Content-Length``).
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from pipeline.core.errors import PipelineError

_CLEN = b"\r\ncontent-length:"
_CLEN_EXACT = b"\r\nContent-Length: "


@dataclass(frozen=True)
class Endpoint:
    """One Triton endpoint (host and port), e.g. one per MIG slice."""

    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def endpoint_from_url(url: str) -> Endpoint:
    """Parse ``host:port``, ``http://host:port`` or ``grpc://host:port``."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    how = "pass --url HOST:PORT, e.g. --url 127.0.0.1:8000"
    if parts.scheme not in ("http", "grpc") or not parts.hostname or parts.path not in ("", "/"):
        raise PipelineError(f"'{url}' is not a server address", how)
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        raise PipelineError(f"'{url}' names no port", how)
    return Endpoint(parts.hostname, port)


def post_request_bytes(endpoint: Endpoint, path: str, body: bytes, json_header_length: int | None = None) -> bytes:
    """A complete HTTP/1.1 POST (headers and body) to be written as is, again and again.

    ``json_header_length`` set means ``body`` is a JSON header followed by binary tensor data
    (Triton's binary tensor data extension, header ``Inference-Header-Content-Length``).
    """
    headers = [
        f"POST {path} HTTP/1.1",
        f"Host: {endpoint.address}",
        "Content-Type: application/octet-stream" if json_header_length is not None else "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if json_header_length is not None:
        headers.append(f"Inference-Header-Content-Length: {json_header_length}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode("ascii") + body


def response_frame(data: bytes | bytearray) -> tuple[int, int] | None:
    """Where the body of the HTTP/1.1 response at the start of ``data`` starts and ends.

    ``None`` while the head is incomplete; raises ``ValueError`` for a response without
    ``Content-Length`` (Triton always sends one for inference responses)."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    at = data.find(_CLEN_EXACT, 0, end)
    if at >= 0:
        at += len(_CLEN_EXACT)
    else:  # header names are case-insensitive; the exact spelling above is the common case
        at = bytes(data[:end]).lower().find(_CLEN)
        if at < 0 or not data.startswith(b"HTTP/1."):
            raise ValueError("response has no Content-Length (chunked, or not HTTP/1.x)")
        at += len(_CLEN)
    stop = data.find(b"\r\n", at, end)
    return end + 4, end + 4 + int(data[at : stop if stop >= 0 else end])


def request_json(
    endpoint: Endpoint, method: str, path: str, body: object | None = None, timeout: float = 5.0
) -> tuple[int, object]:
    """One control-plane call; returns the status and the decoded JSON body (``None`` if empty).

    Raises ``OSError`` (refused, reset, timed out) for the caller to turn into a user error."""
    conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"} if payload else {})
        response = conn.getresponse()
        raw = response.read()
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode("utf-8", "replace")
        return response.status, decoded
    except (TimeoutError, http.client.HTTPException) as exc:
        raise OSError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
