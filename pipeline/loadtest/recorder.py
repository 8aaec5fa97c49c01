"""What a load generator records while it runs: latencies, send lag, errors by kind.

Appending to ``array('q')`` costs about as much as a list append and stores 8 bytes per request;
a measurement window is a pair of positions in these arrays (see :mod:`pipeline.loadtest.window`).
"""

from __future__ import annotations

import errno
import json
import os
from array import array
from dataclasses import dataclass, field

_MAX_SAMPLES_PER_KIND = 3


@dataclass
class Recorder:
    """Per-endpoint record of one load point.

    ``latency_ns``: one entry per successful response, from the request's stamp (send time in a
    closed loop, *scheduled* time in an open loop) to the end of its response.
    ``lag_ns``: open loop only, how late each request went out after its scheduled time.
    ``abandoned``: requests still in flight when the point ended, after the drain period.
    """

    latency_ns: array = field(default_factory=lambda: array("q"))
    lag_ns: array = field(default_factory=lambda: array("q"))
    errors: dict[str, int] = field(default_factory=dict)
    error_samples: dict[str, list[str]] = field(default_factory=dict)
    sent: int = 0
    abandoned: int = 0  # still in flight when the point ended (not an error: the client stopped waiting)

    def error(self, kind: str, detail: str = "") -> None:
        """Count one failed request (or connection attempt) of ``kind``; keep a few messages."""
        self.errors[kind] = self.errors.get(kind, 0) + 1
        samples = self.error_samples.setdefault(kind, [])
        if detail and len(samples) < _MAX_SAMPLES_PER_KIND and detail not in samples:
            samples.append(detail[:300])

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def connection_errors(self) -> int:
        """Requests and connects that failed with their connection (refused, reset, closed, timed out
        connecting), not with an answer: the server went away."""
        return sum(n for kind, n in self.errors.items() if kind.startswith(("connect_", "connection_")))


def lost_kind(exc: BaseException | None) -> str:
    """A short, stable name for a request lost with its connection (the report groups by it)."""
    if exc is None:
        return "connection_closed"
    if isinstance(exc, ConnectionResetError):
        return "connection_reset"
    if isinstance(exc, BrokenPipeError):
        return "connection_broken_pipe"
    if isinstance(exc, ValueError):
        return "bad_response"
    return f"connection_{type(exc).__name__}"


def connect_kind(code: int) -> tuple[str, str]:
    """Kind and message of a failed connect from its errno."""
    name = errno.errorcode.get(code, str(code))
    kind = "connect_refused" if code == errno.ECONNREFUSED else f"connect_{name}"
    return kind, f"{name} {os.strerror(code)}"


def error_detail(body: bytes | bytearray) -> str:
    """The message of a Triton error body (``{"error": "..."}``), else the body's start."""
    text = bytes(body[:400]).decode("utf-8", "replace")
    if text.startswith('{"error":'):
        try:
            return str(json.loads(bytes(body))["error"])
        except (ValueError, KeyError, TypeError):
            pass
    return text
