"""A real HTTP/1.1 keep-alive server on loopback whose answers follow a script.

Not a stand-in for Triton (the Triton tests use the real embedded tritonserver): it exists to
produce, on demand and deterministically, what Triton does only when something goes wrong —
error statuses, connections closed mid-request, responses that never come — so the engine's
error accounting can be checked exactly against what the server did.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Callable
from typing import Self

# A script maps the request's sequence number (0, 1, ...) to "ok", "error", "close" or "hang".
Script = Callable[[int], str]


class ScriptedServer:
    def __init__(self, script: Script, body: bytes = b'{"ok":true}', *, echo: bool = False, delay_s: float = 0.0) -> None:
        self.script = script
        self.body = body
        self.delay_s = delay_s  # each answer waits this long (a slow server that keeps answering)
        self.echo = echo  # answer each request with its own body (which answer belongs to which request shows)
        self._done: Counter[str] = Counter()  # what the server actually did (under _lock: one thread per connection)
        self._lock = threading.Lock()
        self._seq = 0
        self.bodies: list[bytes] = []  # every request body received, in order (under _lock)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []

    def __enter__(self) -> Self:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    @property
    def done(self) -> Counter[str]:
        """A snapshot of what the server did so far, by action; final once the ``with`` block has exited."""
        with self._lock:
            return Counter(self._done)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._stop.set()
            conns = list(self._conns)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() below
        except OSError:
            pass
        self._listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:  # every count is in before the test reads `done`
            thread.join()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._stop.is_set():
                    conn.close()
                    return
                self._conns.append(conn)
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while not self._stop.is_set():
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                while len(buf) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                with self._lock:
                    self.bodies.append(body)
                    action = self.script(self._seq)
                    self._seq += 1
                if action == "close":
                    self._count("close")
                    conn.close()
                    return
                if action == "hang":
                    self._count("hang")
                    self._stop.wait()
                    return
                if self.delay_s:
                    self._stop.wait(self.delay_s)
                status, body = (b"200 OK", body if self.echo else self.body) if action == "ok" else (b"503 Service Unavailable", b'{"error":"busy"}')
                conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
                self._count(action)
        except OSError:
            return
        finally:
            conn.close()

    def _count(self, action: str) -> None:
        with self._lock:
            self._done[action] += 1
