"""Keep ``serve``'s tritonservers up: a server that dies is logged with its cause and started again.

Triton 2.51's Python backend can abort the whole server under concurrent load
(``boost::interprocess::lock_exception``, triton-inference-server/server#8882); before this, ``serve``
then stayed dead. Now each death is logged with why the process ended (exit status or signal) and the
server log's last lines, and the server is restarted on the same ports after a delay from
:data:`RESTART_BACKOFF_S` (the n-th crash in a row waits the n-th delay; a server that stayed up for
:data:`STABLE_AFTER_S` starts the schedule over). While it is down its endpoints refuse connections,
so readiness (``/v2/health/ready``) says so until the new process and its models are ready.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from pipeline.core.errors import PipelineError
from pipeline.triton.server import TritonServer
from pipeline.triton.server_log import last_errors

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # the delays before restart 1, 2, ...; the last repeats
STABLE_AFTER_S = 60.0  # up this long after a (re)start: the next crash counts as the first again


def restart_delay(crashes_in_a_row: int) -> float:
    """Seconds to wait before restarting a server that crashed ``crashes_in_a_row`` (≥ 1) times in a row."""
    return RESTART_BACKOFF_S[min(crashes_in_a_row, len(RESTART_BACKOFF_S)) - 1]


class Supervisor:
    """Watches ``servers`` until ``stop`` is set, restarting each one that died (see the module doc)."""

    def __init__(self, servers: Sequence[TritonServer], stop: threading.Event, *, start_timeout: float = 120.0) -> None:
        self.servers = list(servers)
        self.stop = stop
        self.start_timeout = start_timeout
        self.restarting = False  # a restart is starting a server now (a signal then interrupts it)
        now = time.monotonic()
        self._up_since = {id(s): now for s in self.servers}
        self._crashes = {id(s): 0 for s in self.servers}

    def watch(self, poll_s: float = 0.5) -> None:
        """Until ``stop`` is set: check every server each ``poll_s`` seconds, restart the dead ones."""
        while not self.stop.wait(poll_s):
            for server in self.servers:
                if not server.is_running() and not self.stop.is_set():
                    self._recover(server)

    def _recover(self, server: TritonServer) -> None:
        key = id(server)
        if time.monotonic() - self._up_since[key] >= STABLE_AFTER_S:
            self._crashes[key] = 0
        self._crashes[key] += 1
        cause = server.exit_cause()
        log.error("tritonserver on %s died: %s; last log lines: %s (log: %s)",
                  server.http_url, cause, last_errors(server.log_path, limit=5), server.log_path)
        delay = restart_delay(self._crashes[key])
        log.warning("restarting tritonserver on %s in %.0f s (crash %d in a row); not ready until then",
                    server.http_url, delay, self._crashes[key])
        if self.stop.wait(delay):
            return
        self.restarting = True
        try:
            server.restart(timeout=self.start_timeout)
        except PipelineError as exc:
            log.error("restarting tritonserver on %s failed: %s", server.http_url, exc)
            return
        finally:
            self.restarting = False
        self._up_since[key] = time.monotonic()
        log.warning("tritonserver on %s restarted (restart %d, after: %s) and ready: models %s",
                    server.http_url, server.restarts, cause, ", ".join(server.ready_models))
