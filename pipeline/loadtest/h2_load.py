"""gRPC load without grpcio: HTTP/2 framing written by hand in one epoll loop.

grpcio's Python API costs 100-300 µs of client CPU per call here (futures, callbacks on its
threads, a lock per completion) against perf_analyzer's ~50. gRPC is HTTP/2 with a 5-byte
prefix on each protobuf message, and a load generator needs little of HTTP/2: one connection per
endpoint, one stream per request. The request's HEADERS block is constant bytes (static-table
and literal fields, no dynamic table) and its message is serialized once, so a request is two
frames built by concatenation; every frame due in a loop turn leaves in one ``send``. Responses
are framed by length; their header blocks go through an HPACK decoder (``hpack``), and a block
made only of indexed fields — what a gRPC server sends once its table is warm — is looked up in
a cache instead (it cannot change the table, so its meaning holds until a block that can).
A response is a success when its trailers say ``grpc-status: 0`` after a complete message.

Flow control is honoured both ways: our receive windows are opened to the maximum at once (and
the connection's topped up as data arrives); request DATA larger than the server's windows or
frame size waits for its WINDOW_UPDATE. PING is answered, SETTINGS acknowledged, GOAWAY fails the
streams it names and opens a new connection; a lost connection fails its streams and is re-opened
with a growing back-off, as in the HTTP engine.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections import deque
from typing import Any

from pipeline.core.lazy import import_optional
from pipeline.loadtest.client import Endpoint
from pipeline.loadtest.h2_frames import (
    ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, LAST_STREAM_ID, MAX_WINDOW, PADDED, PING, PREFACE,
    PRIORITY, RST_STREAM, SETTINGS, STATUS_NAMES, WINDOW_UPDATE, all_indexed, frame, request_headers,
)  # fmt: skip
from pipeline.loadtest.loop import EpollLoop, Target, new_socket, take_payload
from pipeline.loadtest.policy import ClosedLoop, OpenLoop, Policy, backoff_ns
from pipeline.loadtest.recorder import connect_kind, lost_kind

_TOP_UP = 2**30  # received bytes after which the connection window is re-opened
_RECV = 262144
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT


class _Stream:
    __slots__ = ("data", "got", "headers_seen", "id", "sent_ns", "stamp_ns", "window")

    def __init__(self, sid: int, stamp_ns: int, sent_ns: int, window: int) -> None:
        self.id = sid
        self.stamp_ns = stamp_ns
        self.sent_ns = sent_ns
        self.window = window
        self.got = 0  # response message bytes received
        self.headers_seen = False
        self.data: memoryview | None = None  # request DATA not yet sent (flow control)


class _Conn:
    """One HTTP/2 connection to one endpoint."""

    def __init__(self, sock: socket.socket, target: _Target, decoder: Any) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.target = target
        self.connecting = True
        self.opened_ns = time.perf_counter_ns()
        self.out = bytearray()
        self.inbuf = bytearray()
        self.streams: dict[int, _Stream] = {}
        self.next_id = 1
        self.send_window = 65535
        self.peer_window = 65535  # the server's SETTINGS_INITIAL_WINDOW_SIZE for our streams
        self.peer_frame = 16384
        self.peer_streams = 2**31
        self.received = 0
        self.blocked: deque[_Stream] = deque()
        self.decoder = decoder
        self.cache: dict[bytes, dict[bytes, bytes]] = {}
        self.fragment: tuple[int, int, bytearray] | None = None  # (stream, flags, block) awaiting CONTINUATION
        self.draining = False
        self.want_out = False
        self.polling_out = False


class _Target(Target):
    """Per-endpoint state (:class:`pipeline.loadtest.loop.Target`), its gRPC messages and its one connection."""

    def __init__(self, endpoint: Endpoint, payloads: list[bytes], policy: Policy, max_in_flight: int) -> None:
        # gRPC messages: uncompressed, length, protobuf
        super().__init__(endpoint, [b"\x00" + len(p).to_bytes(4, "big") + p for p in payloads], policy, max_in_flight, "--grpc-url")
        self.conn: _Conn | None = None
        self.headers = request_headers(endpoint.address)


class H2GrpcEngine(EpollLoop):
    """Closed or open loop of gRPC ModelInfer calls, one HTTP/2 connection per endpoint; the
    interface of :class:`pipeline.loadtest.engine.HttpEngine`."""

    def __init__(self, targets: list[tuple[Endpoint, list[bytes]]], policy: Policy, *, timeout_s: float, max_in_flight: int = 256) -> None:
        super().__init__(policy, timeout_s)
        self._hpack = import_optional("hpack", None, "gRPC load")
        self._targets = [_Target(e, p, policy, max_in_flight) for e, p in targets]
        self._conns: dict[int, _Conn] = {}

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._begin()
        for t in self._targets:
            self._connect(t)

    @property
    def in_flight(self) -> int:
        return sum(len(c.streams) for c in self._conns.values())

    def _before_poll(self) -> None:
        """Every frame this loop turn produced leaves now, one ``send`` per connection."""
        for conn in list(self._conns.values()):
            if conn.want_out and not conn.connecting:
                self._flush(conn)

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            conn.target.recorder.abandoned += len(conn.streams)
            conn.streams.clear()
            self._close(conn)

    # -- requests -------------------------------------------------------------------------------
    def _send(self, t: _Target, stamp_ns: int) -> None:
        conn = t.conn
        message = take_payload(t)
        sid = conn.next_id  # type: ignore[union-attr]
        conn.next_id = sid + 2  # type: ignore[union-attr]
        if sid + 2 > LAST_STREAM_ID:
            conn.draining = True  # type: ignore[union-attr]
        now = time.perf_counter_ns()
        stream = _Stream(sid, stamp_ns or now, now, conn.peer_window)  # type: ignore[union-attr]
        conn.streams[sid] = stream  # type: ignore[union-attr]
        sid4 = sid.to_bytes(4, "big")
        out = conn.out  # type: ignore[union-attr]
        out += len(t.headers).to_bytes(3, "big") + b"\x01\x04" + sid4 + t.headers
        n = len(message)
        if n <= conn.peer_frame and n <= conn.send_window and n <= stream.window:  # type: ignore[union-attr]
            out += n.to_bytes(3, "big") + b"\x00\x01" + sid4 + message
            conn.send_window -= n  # type: ignore[union-attr]
            stream.window -= n
        else:
            stream.data = memoryview(message)
            conn.blocked.append(stream)  # type: ignore[union-attr]
            self._unblock(conn)  # type: ignore[arg-type]
        conn.want_out = True  # type: ignore[union-attr]

    def _unblock(self, conn: _Conn) -> None:
        """Send what the windows allow of requests waiting on flow control."""
        while conn.blocked:
            stream = conn.blocked[0]
            if stream.id not in conn.streams:
                conn.blocked.popleft()
                continue
            data = stream.data
            while data is not None and len(data):
                n = min(len(data), conn.peer_frame, conn.send_window, stream.window)
                if n <= 0:
                    return
                last = n == len(data)
                conn.out += n.to_bytes(3, "big") + bytes((DATA, END_STREAM if last else 0)) + stream.id.to_bytes(4, "big") + data[:n]
                conn.send_window -= n
                stream.window -= n
                data = data[n:]
            stream.data = None
            conn.blocked.popleft()
            conn.want_out = True

    def _room(self, t: _Target) -> bool:
        conn = t.conn
        return conn is not None and not conn.connecting and not conn.draining and len(conn.streams) < min(t.max_open, conn.peer_streams)

    def _refill(self, t: _Target) -> None:
        """Closed loop: back to ``concurrency`` streams; open loop: send the backlog."""
        if not self._running:
            return
        if t.conn is not None and t.conn.draining:
            self._connect(t)  # the draining connection finishes its streams beside the new one
        if isinstance(self._policy, ClosedLoop):
            while self._room(t):
                self._send(t, 0)
        else:
            while t.backlog and self._room(t):
                due = t.backlog.popleft()
                self._send(t, due)
                t.recorder.lag_ns.append(t.conn.streams[t.conn.next_id - 2].sent_ns - due)  # type: ignore[union-attr]

    def _dispatch(self, t: _Target, now: int) -> None:
        due, gaps = t.next_due_ns, t.gaps
        assert gaps is not None  # set when the open loop starts; only the open loop dispatches
        while due <= now:
            t.backlog.append(due)
            due += next(gaps)
        t.next_due_ns = due
        self._refill(t)

    # -- responses ------------------------------------------------------------------------------
    def _readable(self, conn: _Conn) -> None:
        data = self._receive(conn, _RECV)
        if data is None:
            return
        try:
            self._frames(conn, data)
        except ConnectionError as exc:
            self._lost(conn, exc)
            return
        if conn.fd not in self._conns:
            return  # GOAWAY closed it
        if conn.received >= _TOP_UP:
            conn.out += frame(WINDOW_UPDATE, 0, 0, conn.received.to_bytes(4, "big"))
            conn.received = 0
            conn.want_out = True
        if conn.draining and not conn.streams and conn is not conn.target.conn:
            self._close(conn)
        self._refill(conn.target)

    def _frames(self, conn: _Conn, data: bytes) -> None:
        """Handle every complete frame received so far."""
        buf = conn.inbuf
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 9:
            length = int.from_bytes(buf[pos : pos + 3], "big")
            if end - pos - 9 < length:
                break
            kind, flags = buf[pos + 3], buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            payload = buf[pos + 9 : pos + 9 + length]
            pos += 9 + length
            if kind == DATA:
                self._on_data(conn, sid, flags, payload, length)
            elif kind == HEADERS or kind == CONTINUATION:
                self._on_headers(conn, kind, sid, flags, payload)
            elif kind == SETTINGS:
                self._on_settings(conn, flags, payload)
            elif kind == WINDOW_UPDATE:
                self._on_window(conn, sid, payload)
            elif kind == PING and not flags & ACK:
                conn.out += frame(PING, ACK, 0, bytes(payload))
                conn.want_out = True
            elif kind == RST_STREAM:
                self._end(conn, sid, "grpc_rst_stream", f"stream reset by the server (HTTP/2 error {int.from_bytes(payload[:4], 'big')})")
            elif kind == GOAWAY:
                self._on_goaway(conn, payload)
                if conn.fd not in self._conns:
                    return
        del buf[:pos]

    def _on_data(self, conn: _Conn, sid: int, flags: int, payload: bytearray, length: int) -> None:
        conn.received += length
        stream = conn.streams.get(sid)
        if stream is None:
            return
        pad = payload[0] + 1 if flags & PADDED else 0
        stream.got += length - pad
        if flags & END_STREAM:
            self._end(conn, sid, "grpc_no_status", "the response ended without gRPC trailers")

    def _on_headers(self, conn: _Conn, kind: int, sid: int, flags: int, payload: bytearray) -> None:
        if kind == HEADERS:
            start = payload[0] + 1 if flags & PADDED else 0
            start += 5 if flags & PRIORITY else 0
            block = payload[start : len(payload) - (payload[0] if flags & PADDED else 0)]
            if not flags & END_HEADERS:
                conn.fragment = (sid, flags, bytearray(block))
                return
        else:
            if conn.fragment is None:
                return
            sid, first_flags, block = conn.fragment
            block += payload
            if not flags & END_HEADERS:
                return
            conn.fragment = None
            flags = first_flags
        fields = self._decode(conn, bytes(block))
        stream = conn.streams.get(sid)
        if stream is None:
            return
        status = fields.get(b":status")
        if status is not None and status != b"200":
            self._end(conn, sid, f"http_{status.decode('ascii', 'replace')}", "the server answered the gRPC call with HTTP " + status.decode("ascii", "replace"))
            return
        if not flags & END_STREAM:
            stream.headers_seen = True
            return
        code = fields.get(b"grpc-status")
        if code == b"0" and stream.got >= 5:
            now = time.perf_counter_ns()
            del conn.streams[sid]
            conn.target.recorder.latency_ns.append(now - stream.stamp_ns)
            conn.target.failures = 0
            return
        try:
            name = STATUS_NAMES[int(code)] if code is not None else "no_status"
        except (ValueError, IndexError):
            name = "unknown"
        message = fields.get(b"grpc-message", b"").decode("utf-8", "replace")
        self._end(conn, sid, f"grpc_{name}", message or ("no response message" if code == b"0" else f"grpc-status {code!r}"))

    def _decode(self, conn: _Conn, block: bytes) -> dict[bytes, bytes]:
        cached = conn.cache.get(block)
        if cached is not None:
            return cached
        try:
            fields = {bytes(k): bytes(v) for k, v in conn.decoder.decode(block, raw=True)}
        except self._hpack.HPACKError as exc:
            raise ConnectionError(f"bad HPACK block from the server ({exc})") from None
        if all_indexed(block):
            conn.cache[block] = fields
        else:
            conn.cache.clear()  # the block may have changed the dynamic table that indexed blocks refer to
        return fields

    def _on_settings(self, conn: _Conn, flags: int, payload: bytearray) -> None:
        if flags & ACK:
            return
        for pos in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, pos)
            if key == 0x3:
                conn.peer_streams = value
            elif key == 0x4:
                delta = value - conn.peer_window
                conn.peer_window = value
                for stream in conn.streams.values():
                    stream.window += delta
            elif key == 0x5:
                conn.peer_frame = value
        conn.out += frame(SETTINGS, ACK, 0)
        conn.want_out = True
        self._unblock(conn)

    def _on_window(self, conn: _Conn, sid: int, payload: bytearray) -> None:
        increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        if sid == 0:
            conn.send_window += increment
        elif sid in conn.streams:
            conn.streams[sid].window += increment
        self._unblock(conn)

    def _on_goaway(self, conn: _Conn, payload: bytearray) -> None:
        last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        conn.draining = True
        for sid in [s for s in conn.streams if s > last]:
            self._end(conn, sid, "grpc_goaway", "the server closed the connection before handling the request (GOAWAY)")
        if not conn.streams:
            self._close(conn)
            self._reconnect(conn.target, failed=False)

    def _end(self, conn: _Conn, sid: int, kind: str, detail: str) -> None:
        """Stream ``sid`` failed with ``kind``."""
        if conn.streams.pop(sid, None) is None:
            return
        conn.target.recorder.error(kind, detail)
        conn.target.failures += 1

    # -- connections ----------------------------------------------------------------------------
    def _connect(self, t: _Target) -> None:
        conn = _Conn(new_socket(t.family), t, self._hpack.Decoder())
        t.conn = conn
        self._dial(conn)

    def _connected(self, conn: _Conn) -> None:
        conn.connecting = False
        # no server push, a stream window of 2^31-1, a dynamic HPACK table as the server likes; then the connection window
        settings = struct.pack(">HIHI", 0x2, 0, 0x4, MAX_WINDOW)
        conn.out += PREFACE + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, (MAX_WINDOW - 65535).to_bytes(4, "big"))
        conn.want_out = True
        self._epoll.modify(conn.fd, _IN)
        self._refill(conn.target)

    def _connect_failed(self, conn: _Conn, code: int) -> None:
        kind, message = connect_kind(code)
        conn.target.recorder.error(kind, f"{conn.target.endpoint.address}: {message}")
        conn.target.failures += 1
        self._close(conn)
        self._reconnect(conn.target, failed=True)

    def _lost(self, conn: _Conn, exc: BaseException | None) -> None:
        t = conn.target
        kind = lost_kind(exc)
        for sid in list(conn.streams):
            self._end(conn, sid, kind, str(exc) if exc else "server closed the connection mid-request")
        self._close(conn)
        self._reconnect(t, failed=True)

    def _reconnect(self, t: _Target, *, failed: bool) -> None:
        if not self._running or t.retry_armed:
            return
        if failed and t.failures:
            t.retry_armed = True
            self._after(backoff_ns(t.failures), lambda: self._retry(t))
        else:
            self._connect(t)

    def _retry(self, t: _Target) -> None:
        t.retry_armed = False
        if self._running and t.conn is None:
            self._connect(t)

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.fd, None) is None:
            return
        if conn.target.conn is conn:
            conn.target.conn = None
        try:
            self._epoll.unregister(conn.fd)
        except (OSError, ValueError):
            pass  # never registered, or epoll already closed
        conn.sock.close()

    def _flush(self, conn: _Conn) -> None:
        if conn.out:
            try:
                n = conn.sock.send(conn.out)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                self._lost(conn, exc)
                return
            del conn.out[:n]
        conn.want_out = False
        waiting = bool(conn.out)
        if waiting != conn.polling_out:  # EPOLLOUT only while the socket's buffer is full
            conn.polling_out = waiting
            self._epoll.modify(conn.fd, _IN | _OUT if waiting else _IN)

    def _watch(self, now: int) -> None:
        """Time out streams (and connects) older than the timeout; a timed-out stream is reset."""
        self._next_watch_ns = now + self._watch_every_ns
        limit = now - self._timeout_ns
        for conn in list(self._conns.values()):
            if conn.connecting:
                if conn.opened_ns < limit:
                    conn.target.recorder.error("connect_timeout", f"no connection within {self._timeout_ns / 1e9:g} s")
                    conn.target.failures += 1
                    self._close(conn)
                    self._reconnect(conn.target, failed=True)
                continue
            for sid in [s for s, st in conn.streams.items() if st.sent_ns < limit]:
                self._end(conn, sid, "timeout", f"no response within {self._timeout_ns / 1e9:g} s")
                conn.out += frame(RST_STREAM, 0, sid, (8).to_bytes(4, "big"))  # CANCEL
                conn.want_out = True
            self._refill(conn.target)
