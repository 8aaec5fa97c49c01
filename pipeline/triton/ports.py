"""Ports of the embedded server: which are taken, which the OS hands out free, and how a client reaches them."""

from __future__ import annotations

import contextlib
import socket


def client_host(host: str) -> str:
    """The address a client reaches a server listening on ``host`` at (any-address: loopback; IPv6 in brackets)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def port_taken(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails now (something listens there)."""
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
