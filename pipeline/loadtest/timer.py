"""A wake-up with microsecond precision for the open-loop schedule: a Linux ``timerfd``.

``epoll``'s own timeout has a 1 ms grain (Python rounds it up), which would send every
open-loop request up to a millisecond late. A ``timerfd`` armed at the absolute due time
(``CLOCK_MONOTONIC``, the clock behind ``time.perf_counter_ns`` on Linux) becomes readable
on time and is polled with the connections. Where it is unavailable the engine falls back
to epoll's timeout, and the reported send lag shows the difference.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time

log = logging.getLogger(__name__)

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class DueTimer:
    """A file descriptor that becomes readable at the time given to :meth:`arm`."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._settime = libc.timerfd_settime
        self._fd = fd
        self._spec = _Itimerspec()
        self._armed_ns = 0

    @classmethod
    def create(cls) -> DueTimer | None:
        """A timer, or ``None`` where ``timerfd`` or a monotonic ``perf_counter`` is missing."""
        if "CLOCK_MONOTONIC" not in time.get_clock_info("perf_counter").implementation:
            return None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        return cls(libc, fd)

    def fileno(self) -> int:
        return self._fd

    def arm(self, due_ns: int) -> None:
        """Become readable at ``due_ns`` (``time.perf_counter_ns`` clock); re-arming replaces it."""
        if due_ns == self._armed_ns:
            return
        self._armed_ns = due_ns
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(max(due_ns, 1), 1_000_000_000)
        if self._settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def clear(self) -> None:
        """Consume the expiry so the descriptor is no longer readable."""
        self._armed_ns = 0
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self._fd)
