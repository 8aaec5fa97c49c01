"""What the HTTP and the HTTP/2 (gRPC) engines share: the per-endpoint state (:class:`Target`), the
epoll, the open-loop due timer, the time-out watch, and the end of a point (drain, then count what was
abandoned or never sent)."""

from __future__ import annotations

import errno
import heapq
import itertools
import select
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.core.errors import PipelineError
from pipeline.loadtest.client import Endpoint
from pipeline.loadtest.policy import ClosedLoop, Issued, OpenLoop, Policy
from pipeline.loadtest.recorder import Recorder
from pipeline.loadtest.timer import DueTimer

_IN, _OUT, _BAD = select.EPOLLIN, select.EPOLLOUT, select.EPOLLHUP | select.EPOLLERR


class Target:
    """Per-endpoint state of an epoll engine: its requests, its open-loop schedule, its back-off and its
    record; ``max_open`` caps its connections (HTTP) or streams (HTTP/2), the concurrency in a closed loop."""

    def __init__(self, endpoint: Endpoint, payloads: list[bytes], policy: Policy | Issued, max_open: int, url_flag: str) -> None:
        self.endpoint = endpoint
        self.payloads = payloads
        self.next_payload = 0
        self.recorder = Recorder()
        self.want = policy.concurrency if isinstance(policy, ClosedLoop) else 0
        self.max_open = policy.concurrency if isinstance(policy, ClosedLoop) else max_open
        self.backlog: deque[int] = deque()
        self.failures = 0
        self.retry_armed = False
        self.next_due_ns = 0
        self.gaps: Iterator[int] | None = None
        self.unsent = 0
        try:
            info = socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)[0]
        except OSError as exc:
            raise PipelineError(f"cannot resolve '{endpoint.host}' ({exc})", f"pass {url_flag} with a reachable HOST:PORT") from None
        self.family, self.sockaddr = info[0], info[4]


def new_socket(family: int) -> socket.socket:
    """A non-blocking TCP socket without Nagle's delay."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def take_payload(t: Any) -> bytes:
    """The next of ``t.payloads`` in turn, counted as sent."""
    i = t.next_payload
    t.next_payload = i + 1 if i + 1 < len(t.payloads) else 0
    t.recorder.sent += 1
    return t.payloads[i]


class EpollLoop:
    """Base of an engine whose ``_targets`` each have ``recorder``, ``backlog``, ``unsent``,
    ``gaps`` and ``next_due_ns``; the engine adds ``in_flight``, ``run_until`` and ``_close_all``."""

    _targets: list[Any]
    _conns: dict[int, Any]

    def __init__(self, policy: Policy | Issued, timeout_s: float) -> None:
        self._policy = policy
        self._timeout_ns = int(timeout_s * 1e9)
        self._watch_every_ns = min(100_000_000, self._timeout_ns // 4)
        self._next_watch_ns = 0
        self._epoll = select.epoll()
        self._running = False
        self._due_timer: DueTimer | None = None
        self._timers: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    @property
    def recorders(self) -> list[Recorder]:
        return [t.recorder for t in self._targets]

    @property
    def in_flight(self) -> int:
        raise NotImplementedError

    def run_until(self, deadline_ns: int) -> None:
        """Serve events, timers and the schedule until ``deadline_ns`` (``perf_counter_ns``)."""
        poll, conns, pc = self._epoll.poll, self._conns, time.perf_counter_ns
        open_loop = isinstance(self._policy, OpenLoop)
        due_timer = self._due_timer
        due_fd = due_timer.fileno() if due_timer is not None else -1
        while True:
            now = pc()
            if now >= deadline_ns:
                return
            wake = deadline_ns
            if open_loop and self._running:
                due = deadline_ns
                for t in self._targets:
                    if t.next_due_ns <= now:
                        self._dispatch(t, now)
                    due = min(due, t.next_due_ns)
                if due_timer is not None:
                    due_timer.arm(due)
                else:
                    wake = due
            timers = self._timers
            while timers and timers[0][0] <= now:
                heapq.heappop(timers)[2]()
            if timers:
                wake = min(wake, timers[0][0])
            if now >= self._next_watch_ns:
                self._watch(now)
            wake = min(wake, self._next_watch_ns)
            self._before_poll()
            # epoll's timeout has 1 ms grain (rounded up); the open-loop send lag shows the cost.
            for fd, events in poll(max(0, wake - now) / 1e9):
                conn = conns.get(fd)
                if conn is None:
                    if fd == due_fd:
                        due_timer.clear()  # type: ignore[union-attr]
                    continue
                if conn.connecting:
                    code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code:
                        self._connect_failed(conn, code)
                    else:
                        self._connected(conn)
                    continue
                if events & _OUT and conn.out is not None:
                    self._flush(conn)
                if events & (_IN | _BAD):
                    self._readable(conn)

    def _dispatch(self, t: Any, now: int) -> None:
        """Send (or queue) every request of ``t`` that is due by ``now``."""
        raise NotImplementedError

    def _watch(self, now: int) -> None:
        """Time out what waited too long; set ``_next_watch_ns``."""
        raise NotImplementedError

    def _connected(self, conn: Any) -> None:
        """``conn``'s connect succeeded."""
        raise NotImplementedError

    def _flush(self, conn: Any) -> None:
        raise NotImplementedError

    def _readable(self, conn: Any) -> None:
        raise NotImplementedError

    def _lost(self, conn: Any, exc: BaseException | None) -> None:
        """``conn`` failed (``exc``) or the server closed it (``None``)."""
        raise NotImplementedError

    def _receive(self, conn: Any, size: int) -> bytes | None:
        """What ``conn`` has to read, or ``None`` (nothing yet, or the connection is lost and handled)."""
        try:
            data = conn.sock.recv(size)
        except BlockingIOError:
            return None
        except OSError as exc:
            self._lost(conn, exc)
            return None
        if not data:
            self._lost(conn, None)
            return None
        return data

    def _before_poll(self) -> None:
        """Called once per loop turn before waiting (the HTTP/2 engine sends its batched frames)."""

    def _after(self, delay_ns: int, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.perf_counter_ns() + delay_ns, next(self._seq), callback))
    def _close_all(self) -> None:
        """Close every connection, counting its requests in flight as abandoned."""
        raise NotImplementedError

    def _connect_failed(self, conn: Any, code: int) -> None:
        raise NotImplementedError

    def _dial(self, conn: Any) -> None:
        """Start ``conn``'s connect to its target (``conn.sock``, ``conn.fd``, ``conn.target.sockaddr``);
        the engine's ``_conns`` holds it from now; one refused at once goes to ``_connect_failed``."""
        self._conns[conn.fd] = conn
        code = conn.sock.connect_ex(conn.target.sockaddr)
        if code not in (0, errno.EINPROGRESS):
            self._connect_failed(conn, code)
            return
        self._epoll.register(conn.fd, select.EPOLLOUT)

    def _begin(self) -> int:
        """Start running: the watch, the due timer and each target's schedule (open loop); returns now."""
        self._running = True
        now = time.perf_counter_ns()
        self._next_watch_ns = now + self._watch_every_ns
        if isinstance(self._policy, OpenLoop):
            self._due_timer = DueTimer.create()
            if self._due_timer is not None:
                self._epoll.register(self._due_timer.fileno(), select.EPOLLIN)
            for t in self._targets:
                t.gaps = self._policy.gaps_ns()
                t.next_due_ns = now + next(t.gaps)
        return now

    def stop(self) -> None:
        """Send nothing new; requests in flight may still complete."""
        self._running = False

    def finish(self, drain_s: float) -> None:
        """Stop, wait up to ``drain_s`` for requests in flight, then close every connection.

        Requests still in flight then are counted as ``abandoned``; open-loop requests that never
        went out as ``unsent`` (per endpoint)."""
        self.stop()
        deadline = time.perf_counter_ns() + int(drain_s * 1e9)
        while self.in_flight and time.perf_counter_ns() < deadline:
            self.run_until(min(deadline, time.perf_counter_ns() + 5_000_000))
        self._close_all()
        self._timers.clear()
        for t in self._targets:
            t.unsent += len(t.backlog)
            t.backlog.clear()
        self._epoll.close()
        if self._due_timer is not None:
            self._due_timer.close()

    @property
    def unsent(self) -> list[int]:
        """Per endpoint: open-loop requests scheduled but never sent (known after ``finish``)."""
        return [t.unsent for t in self._targets]
