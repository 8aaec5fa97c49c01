"""Atomic file writes: hidden temporaries beside the destination (``.<name>.<random>.tmp``), renamed
into place, so a killed run never leaves a half-written file under the real name. A killed run
leaves only the hidden temporaries; :func:`clear_leftovers` removes them on the next run."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def clear_leftovers(dst: Path) -> None:
    """Remove ``.<dst name>.*`` files and folders that a killed earlier run left beside ``dst``."""
    dst = Path(dst)
    if not dst.parent.is_dir():
        return
    for stale in dst.parent.glob(f".{dst.name}.*"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def hidden_temporary(dst: Path, *, mode: int = 0o644) -> Path:
    """A new empty file ``.<name>.<random>.tmp<suffix>`` beside ``dst`` (its folder made, earlier leftovers cleared)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    clear_leftovers(dst)
    fd, name = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp" + dst.suffix)
    os.close(fd)
    os.chmod(name, mode)  # mkstemp makes 0600; outputs are ordinary files
    return Path(name)


@contextlib.contextmanager
def atomic_path(dst: Path, *, mode: int = 0o644) -> Iterator[Path]:
    """Yield a hidden temporary path beside ``dst`` to write to; on success it replaces ``dst``.

    The temporary exists (empty) when yielded, so tools that write by path can use it; it keeps
    ``dst``'s suffix (``.<name>.<random>.tmp<suffix>``) for tools that infer a format from it. On
    an exception it is removed and ``dst`` is untouched. Leftovers of earlier killed runs go first.
    """
    dst = Path(dst)
    tmp = hidden_temporary(dst, mode=mode)
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(dst: Path, data: Any, *, mode: int = 0o644) -> Path:
    """Write ``data`` (bytes or any buffer, e.g. a TensorRT ``IHostMemory``) to ``dst`` atomically."""
    with atomic_path(dst, mode=mode) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
    return Path(dst)


def write_text_atomic(dst: Path, text: str) -> Path:
    """Write ``text`` to ``dst`` atomically (see :func:`write_bytes_atomic`)."""
    return write_bytes_atomic(dst, text.encode())
