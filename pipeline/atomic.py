"""Leftovers of killed stages: stages write to hidden temporaries beside their output
(``.<name>.*``) and rename into place; a killed run leaves those behind, the next run clears them."""

from __future__ import annotations

import shutil
from pathlib import Path


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


def write_text_atomic(dst: Path, text: str) -> Path:
    """Write ``text`` to a hidden ``.<name>.<random>`` temporary beside ``dst`` and rename it into place."""
    import os
    import tempfile

    dst = Path(dst)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dst
