"""argparse value types shared by the commands: a bad value is one argparse error line."""

from __future__ import annotations

import argparse


def number(text: str) -> float:
    """A float option value."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None


def port(text: str) -> int:
    """A TCP port: 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range (0-65535, 0 = any free port)")
    return value
