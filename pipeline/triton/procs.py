"""Processes and ports of the embedded tritonserver: exit status without reaping, the process group's end,
why a process ended, free ports and the address clients use."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time

log = logging.getLogger(__name__)


def peek_exit(process: subprocess.Popen[bytes]) -> int | None:
    """The exit status of an exited child without reaping it (None while it runs)."""
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return process.returncode if process.returncode is not None else -1
    return None if info is None else info.si_status


def wait_group_gone(pgid: int, timeout: float) -> None:
    """Wait until no process of the group is left (SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    log.warning("processes of tritonserver's group %d are still exiting", pgid)


def client_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def port_taken(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports the OS says are free now (held open together so they differ)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def exit_cause(process: subprocess.Popen[bytes]) -> str:
    """Why an exited child ended, in words ("killed by SIGKILL", "exited with status 1"), without reaping it."""
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already: Popen keeps the status, negative for a signal
        code = process.returncode
        if code is None:
            return "ended (status unknown)"
        return _signal_words(-code) if code < 0 else f"exited with status {code}"
    if info is None:
        return "still running"
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return _signal_words(info.si_status) + (" (core dumped)" if info.si_code == os.CLD_DUMPED else "")
    return f"exited with status {info.si_status}"


def _signal_words(number: int) -> str:
    with contextlib.suppress(ValueError):
        return f"killed by {signal.Signals(number).name}"
    return f"killed by signal {number}"
