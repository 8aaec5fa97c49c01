"""The HTTP load engine: one epoll loop over keep-alive connections to one or more endpoints.

Why not asyncio: measured on this project's 2-core machine against Triton, an ``asyncio.Protocol``
client spent ~20-30 µs of user CPU per request, ``loop.add_reader`` callbacks ~20 µs, and this
plain epoll loop ~10 µs (wrk: ~5 µs). On a machine where the client shares cores with the
server, every microsecond the client burns is taken from the server it is measuring.

A closed loop keeps ``concurrency`` connections per endpoint, each re-sending the moment its
response is complete. An open loop sends every request that is due (constant or Poisson
schedule) on an idle connection; with none idle the request waits in a backlog — its latency
still counts from the scheduled time — while another connection opens, up to ``max_connections``.
Failed connections are re-opened one at a time with a growing back-off, so a dead server gives
counted errors, not a busy loop.
"""

from __future__ import annotations

import select
import socket
import time

from pipeline.loadtest.client import Endpoint, response_frame
from pipeline.loadtest.loop import EpollLoop, Target, new_socket, take_payload
from pipeline.loadtest.policy import ClosedLoop, Issued, OpenLoop, Policy, backoff_ns
from pipeline.loadtest.recorder import connect_kind, error_detail, lost_kind

_RECV = 65536
_IN, _OUT, _BAD = select.EPOLLIN, select.EPOLLOUT, select.EPOLLHUP | select.EPOLLERR


class _Target(Target):
    """Per-endpoint state (:class:`pipeline.loadtest.loop.Target`) and its connections."""

    def __init__(self, endpoint: Endpoint, payloads: list[bytes], policy: Policy | Issued, max_connections: int) -> None:
        super().__init__(endpoint, payloads, policy, max_connections, "--url")
        self.open: set[_Conn] = set()
        self.connecting = 0
        self.idle: list[_Conn] = []


class _Conn:
    __slots__ = ("buf", "busy", "connecting", "fd", "out", "sent_ns", "sock", "stamp_ns", "target")

    def __init__(self, sock: socket.socket, target: _Target) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.target = target
        self.connecting = True
        self.busy = False
        self.stamp_ns = 0
        self.sent_ns = 0
        self.buf: bytearray | None = None
        self.out: memoryview | None = None


class HttpEngine(EpollLoop):
    """Drive ``policy`` against every endpoint; each endpoint gets the full policy (its own
    ``concurrency`` connections, or its own ``rate``) and its own :class:`~pipeline.loadtest.recorder.Recorder`.

    Use: ``start()``, then ``run_until(deadline_ns)`` as often as needed (the controller reads the
    recorders in between), then ``finish(drain_s)``.
    """

    def __init__(
        self,
        targets: list[tuple[Endpoint, list[bytes]]],
        policy: Policy | Issued,
        *,
        timeout_s: float,
        max_connections: int = 256,
    ) -> None:
        super().__init__(policy, timeout_s)
        self._targets = [_Target(e, p, policy, max_connections) for e, p in targets]
        self._conns: dict[int, _Conn] = {}

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Open connections (closed loop: all of them) and start the open-loop schedules."""
        self._begin()
        for t in self._targets:
            if isinstance(self._policy, OpenLoop):
                t.want = min(t.max_open, 4)
            self._grow(t)

    @property
    def in_flight(self) -> int:
        return sum(1 for c in self._conns.values() if c.busy)

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            if conn.busy:
                conn.target.recorder.abandoned += 1
                conn.busy = False
            self._close(conn)

    # -- the hot path ---------------------------------------------------------------------------
    def _send(self, conn: _Conn, stamp_ns: int) -> None:
        t = conn.target
        payload = take_payload(t)
        conn.busy = True
        conn.stamp_ns = stamp_ns
        conn.sent_ns = sent = time.perf_counter_ns()
        if not stamp_ns:
            conn.stamp_ns = sent
        try:
            n = conn.sock.send(payload)
        except BlockingIOError:
            n = 0
        except OSError as exc:
            self._lost(conn, exc)
            return
        if n < len(payload):
            conn.out = memoryview(payload)[n:]
            self._epoll.modify(conn.fd, _IN | _OUT)

    def _flush(self, conn: _Conn) -> None:
        try:
            n = conn.sock.send(conn.out)  # type: ignore[arg-type]
        except BlockingIOError:
            return
        except OSError as exc:
            self._lost(conn, exc)
            return
        conn.out = conn.out[n:]  # type: ignore[index]
        if not len(conn.out):
            conn.out = None
            self._epoll.modify(conn.fd, _IN)

    def _readable(self, conn: _Conn) -> None:
        data = self._receive(conn, _RECV)
        if data is None:
            return
        if conn.buf is not None:
            conn.buf += data
            data = conn.buf  # type: ignore[assignment]
        try:
            frame = response_frame(data)
        except ValueError as exc:
            self._lost(conn, exc)
            return
        if frame is None or len(data) < frame[1]:
            if conn.buf is None:
                conn.buf = bytearray(data)
            return
        now = time.perf_counter_ns()
        conn.buf = None
        conn.busy = False
        t = conn.target
        if data[9:12] == b"200":
            t.recorder.latency_ns.append(now - conn.stamp_ns)
            self._answered(conn, data, frame[0])
        else:
            t.recorder.error(f"http_{bytes(data[9:12]).decode('ascii', 'replace')}", error_detail(data[frame[0] : frame[1]]))
        self._ready(conn)

    def _answered(self, conn: _Conn, response: bytes | bytearray, body_at: int) -> None:
        """A 200 response arrived on ``conn`` (its head and body; the body starts at ``body_at``): nothing to keep in a
        load test, whose answers are counted, not read."""

    def _ready(self, conn: _Conn) -> None:
        """``conn`` can take a request."""
        if not self._running:
            return
        t = conn.target
        if isinstance(self._policy, ClosedLoop):
            self._send(conn, 0)
        elif t.backlog:
            due = t.backlog.popleft()
            self._send(conn, due)
            t.recorder.lag_ns.append(conn.sent_ns - due)
        else:
            t.idle.append(conn)

    def _dispatch(self, t: _Target, now: int) -> None:
        """Send (or queue) every request of ``t`` that is due by ``now``."""
        due, gaps, lag, idle = t.next_due_ns, t.gaps, t.recorder.lag_ns, t.idle
        while due <= now:
            if idle:
                conn = idle.pop()
                self._send(conn, due)
                lag.append(conn.sent_ns - due)
            else:
                t.backlog.append(due)
            due += next(gaps)  # type: ignore[arg-type]
        t.next_due_ns = due
        if t.backlog:
            t.want = min(t.max_open, len(t.open) + t.connecting + len(t.backlog))
            self._grow(t)

    # -- connections ----------------------------------------------------------------------------
    def _grow(self, t: _Target) -> None:
        """Open connections up to ``t.want``; after failures, one attempt per back-off period."""
        if not self._running:
            return
        while not t.failures and len(t.open) + t.connecting < t.want:
            self._connect(t)
        if t.failures and not t.retry_armed and len(t.open) + t.connecting < t.want:
            t.retry_armed = True
            delay = backoff_ns(t.failures)
            self._after(delay, lambda: self._retry(t))

    def _retry(self, t: _Target) -> None:
        t.retry_armed = False
        if self._running and len(t.open) + t.connecting < t.want:
            self._connect(t)

    def _connect(self, t: _Target) -> None:
        conn = _Conn(new_socket(t.family), t)
        conn.sent_ns = time.perf_counter_ns()  # connect timeouts count from here
        t.connecting += 1
        self._dial(conn)

    def _connected(self, conn: _Conn) -> None:
        t = conn.target
        conn.connecting = False
        t.connecting -= 1
        t.failures = 0
        t.open.add(conn)
        self._epoll.modify(conn.fd, _IN)
        self._ready(conn)
        self._grow(t)

    def _connect_failed(self, conn: _Conn, code: int) -> None:
        t = conn.target
        kind, message = connect_kind(code)
        t.recorder.error(kind, f"{t.endpoint.address}: {message}")
        t.connecting -= 1
        conn.connecting = False
        self._close(conn)
        t.failures += 1
        self._grow(t)

    def _lost(self, conn: _Conn, exc: BaseException | None) -> None:
        t = conn.target
        if conn.busy:
            conn.busy = False
            t.recorder.error(lost_kind(exc), str(exc) if exc else "server closed the connection mid-request")
            t.failures += 1
        self._close(conn)
        if isinstance(self._policy, ClosedLoop) or t.backlog:
            self._grow(t)

    def _close(self, conn: _Conn) -> None:
        t = conn.target
        if self._conns.pop(conn.fd, None) is None:
            return
        t.open.discard(conn)
        if conn in t.idle:
            t.idle.remove(conn)
        if conn.connecting:
            t.connecting -= 1
            conn.connecting = False
        try:
            self._epoll.unregister(conn.fd)
        except (OSError, ValueError):
            pass  # never registered (connect failed at once) or epoll already closed
        conn.sock.close()

    def _watch(self, now: int) -> None:
        """Time out requests (and connects) older than the timeout; their connection is dropped."""
        self._next_watch_ns = now + self._watch_every_ns
        limit = now - self._timeout_ns
        for conn in list(self._conns.values()):
            if conn.sent_ns >= limit:
                continue
            if conn.connecting:
                conn.target.recorder.error("connect_timeout", f"no connection within {self._timeout_ns / 1e9:g} s")
                conn.target.failures += 1
                self._close(conn)
                self._grow(conn.target)
            elif conn.busy:
                conn.busy = False
                conn.target.recorder.error("timeout", f"no response within {self._timeout_ns / 1e9:g} s")
                conn.target.failures += 1
                self._close(conn)
                if isinstance(self._policy, ClosedLoop) or conn.target.backlog:
                    self._grow(conn.target)
