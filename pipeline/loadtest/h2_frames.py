"""HTTP/2 and HPACK pieces of the gRPC load engine (:mod:`pipeline.loadtest.h2_load`): frame types
and flags, the request's constant HEADERS block, and which header blocks may be cached."""

from __future__ import annotations

PATH = b"/inference.GRPCInferenceService/ModelInfer"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
MAX_WINDOW = 2**31 - 1
LAST_STREAM_ID = 2**31 - 1
STATUS_NAMES = (
    "ok", "cancelled", "unknown", "invalid_argument", "deadline_exceeded", "not_found", "already_exists",
    "permission_denied", "resource_exhausted", "failed_precondition", "aborted", "out_of_range", "unimplemented",
    "internal", "unavailable", "data_loss", "unauthenticated",
)  # fmt: skip


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame: 24-bit length, type, flags, stream id, payload."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def hpack_string(value: bytes) -> bytes:
    """An HPACK string literal, not Huffman-coded (7-bit prefix length)."""
    n = len(value)
    if n < 127:
        return bytes((n,)) + value
    out, n = bytearray((127,)), n - 127
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + value


def request_headers(authority: str) -> bytes:
    """The HEADERS block of every request: static-table fields and literals never indexed, so it
    is the same bytes for every request and leaves the server's decoder table alone."""
    return (
        b"\x83\x86"  # :method POST, :scheme http
        + b"\x04" + hpack_string(PATH)  # :path (static name 4), literal value
        + b"\x01" + hpack_string(authority.encode())  # :authority (static name 1)
        + b"\x0f\x10" + hpack_string(b"application/grpc")  # content-type (static name 31)
        + b"\x00" + hpack_string(b"te") + hpack_string(b"trailers")
    )


def all_indexed(block: bytes) -> bool:
    """Whether an HPACK block is only indexed fields (``1xxxxxxx`` and its integer): such a block
    reads the decoder's table but never changes it."""
    pos, end = 0, len(block)
    while pos < end:
        if not block[pos] & 0x80:
            return False
        if block[pos] & 0x7F == 0x7F:  # multi-byte index
            pos += 1
            while pos < end and block[pos] & 0x80:
                pos += 1
        pos += 1
    return True
