"""Triton as LoadGen's system under test, through the load test's own HTTP engine (pipeline/loadtest/engine.py):
the epoll loop over keep-alive connections with every request encoded before the run, so the client costs
microseconds per query and is not what LoadGen measures.

LoadGen issues from its own threads; the engine runs in one thread of its own. An issued sample goes into a queue
and an eventfd wakes the loop, which sends it on an idle connection or opens another (up to ``max_connections``)
while it waits. Each answer (a response, an HTTP error, a lost connection or a time-out: LoadGen must hear of every
sample, or it waits forever) goes back through :func:`pipeline.loadtest.loadgen.run.complete`; failures are
counted by the engine's recorder as in any load test. In accuracy mode (``keep_answers``) each answer carries the
whole HTTP response, head and body, for LoadGen's accuracy log; a failed sample's answer is empty."""

from __future__ import annotations

import os
import select
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from pipeline.loadtest.client import Endpoint
from pipeline.loadtest.engine import HttpEngine
from pipeline.loadtest.loadgen.run import complete
from pipeline.loadtest.policy import Issued
from pipeline.loadtest.recorder import Recorder

_TURN_NS = 50_000_000  # the engine thread checks for the end of the run this often


class IssuedHttp(HttpEngine):
    """An :class:`HttpEngine` whose requests are the samples LoadGen issues (:meth:`submit`, from any thread):
    sample ``i`` is the ``i``-th encoded request; its latency counts from when it was issued."""

    def __init__(self, endpoint: Endpoint, payloads: list[bytes], scenario: str, *, timeout_s: float, max_connections: int,
                 keep_answers: bool = False) -> None:
        super().__init__([(endpoint, payloads)], Issued(scenario), timeout_s=timeout_s, max_connections=max_connections)
        self._keep_answers = keep_answers
        self._answers: dict[int, bytes] = {}  # connection fd → its 200 response, until LoadGen hears of it
        self._answered_ns = 0  # when the server last answered a request (perf_counter_ns)
        self._incoming: deque[tuple[int, int, int]] = deque()  # (response id, sample index, issued at), from LoadGen's threads
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake, select.EPOLLIN)
        self._waiting: dict[int, tuple[int, int]] = {}  # response id → (sample index, issued at), until sent
        self._on_conn: dict[int, int] = {}  # connection fd → response id in flight on it

    @property
    def recorder(self) -> Recorder:
        return self._targets[0].recorder

    def submit(self, samples: Sequence[tuple[int, int]]) -> None:
        """Queue ``(response id, sample index)`` pairs and wake the loop (thread-safe)."""
        now = time.perf_counter_ns()
        self._incoming.extend((response_id, index, now) for response_id, index in samples)
        self.wake()

    def close(self) -> None:
        """Close the wake-up descriptor (after :meth:`finish`)."""
        os.close(self._wake)

    # -- the engine's hooks ---------------------------------------------------------------------
    def wake(self) -> None:
        """Make the loop's current wait return (thread-safe)."""
        os.eventfd_write(self._wake, 1)

    def _before_poll(self) -> None:
        try:  # every turn: a wake-up read before its samples were queued would otherwise keep the descriptor readable
            os.eventfd_read(self._wake)
        except BlockingIOError:
            pass
        if not self._incoming:
            return
        t = self._targets[0]
        while self._incoming:
            response_id, index, issued = self._incoming.popleft()
            self._waiting[response_id] = (index, issued)
            if t.idle:
                self._send(t.idle.pop(), response_id)
            else:
                t.backlog.append(response_id)
        if t.backlog:
            t.want = min(t.max_open, len(t.open) + t.connecting + len(t.backlog))
            self._grow(t)

    def _send(self, conn: Any, stamp_ns: int) -> None:
        response_id = stamp_ns  # this engine's backlog holds response ids, not due times
        index, issued = self._waiting.pop(response_id)
        t = conn.target
        t.next_payload = index  # the base engine sends its target's next payload: make it this sample's
        self._on_conn[conn.fd] = response_id
        super()._send(conn, issued)
        t.recorder.lag_ns.append(conn.sent_ns - issued)  # how long the sample waited for a connection

    def _answered(self, conn: Any, response: bytes | bytearray, body_at: int) -> None:
        if self._keep_answers:
            self._answers[conn.fd] = bytes(response)

    def _ready(self, conn: Any) -> None:
        response_id = self._on_conn.pop(conn.fd, None)
        if response_id is not None:  # its response is complete (a 200 or an HTTP error, recorded as such)
            self._answered_ns = time.perf_counter_ns()
            complete([(response_id, self._answers.pop(conn.fd, None))])
        if not self._running:
            return
        t = conn.target
        if t.backlog:
            self._send(conn, t.backlog.popleft())
        else:
            t.idle.append(conn)

    def _close(self, conn: Any) -> None:
        response_id = self._on_conn.pop(conn.fd, None)
        super()._close(conn)
        if response_id is not None:  # lost or timed out (the recorder has counted it): LoadGen still needs its answer
            complete([(response_id, None)])

    def _dispatch(self, t: Any, now: int) -> None:  # no schedule of its own: LoadGen's is the schedule
        pass

    def _watch(self, now: int) -> None:
        super()._watch(now)
        # While the server answers nothing for a whole time-out (it is down, every connect refused), a sample that has
        # waited that long for a connection is answered as failed: LoadGen waits for every sample it issued, for ever.
        # Samples only queued behind others (Offline issues every sample at once) wait as long as answers keep coming.
        limit = now - self._timeout_ns
        if self._answered_ns >= limit:
            return
        expired = [rid for rid, (_, issued) in self._waiting.items() if issued < limit]
        if not expired:
            return
        t = self._targets[0]
        gone = set(expired)
        t.backlog = deque(rid for rid in t.backlog if rid not in gone)
        for rid in expired:
            del self._waiting[rid]
            t.recorder.error("not_sent", f"no connection to send it on within {self._timeout_ns / 1e9:g} s")
        complete([(rid, None) for rid in expired])


class TritonSut:
    """LoadGen's system under test for one model on one Triton endpoint: an :class:`IssuedHttp` engine run in a
    thread of its own between :meth:`start` and :meth:`stop`."""

    def __init__(self, name: str, endpoint: Endpoint, payloads: list[bytes], scenario: str, *, timeout_s: float = 30.0,
                 max_connections: int = 64, keep_answers: bool = False) -> None:
        self.name = name
        self.engine = IssuedHttp(endpoint, payloads, scenario, timeout_s=timeout_s, max_connections=max_connections, keep_answers=keep_answers)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"sut-{name}", daemon=True)

    def start(self) -> None:
        self.engine.start()
        self._thread.start()

    def _loop(self) -> None:
        while not self._done.is_set():
            self.engine.run_until(time.perf_counter_ns() + _TURN_NS)

    def issue(self, samples: Sequence[tuple[int, int]]) -> None:
        self.engine.submit(samples)

    def flush(self) -> None:
        pass

    def stop(self, drain_s: float = 5.0) -> None:
        """End the engine thread, then finish the engine (requests still in flight after ``drain_s`` are abandoned)."""
        self._done.set()
        self.engine.wake()
        self._thread.join()
        self.engine.finish(drain_s)
        self.engine.close()
