"""Content hashes of files, folders and settings: the keys that let a stage be skipped."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def hash_path(path: Path) -> str:
    """sha256 of a file, or of a folder's relative paths and file contents (sorted). An ONNX model with
    external data is hashed with its data files (their names and contents, after the graph's)."""
    from pipeline.core.onnx_files import data_files

    digest = hashlib.sha256()
    path = Path(path)
    files = [path, *data_files(path)] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if path.is_dir():
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        elif file != path:
            digest.update(b"\0" + file.name.encode() + b"\0")
        with open(file, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def hash_settings(settings: Any) -> str:
    """sha256 of a JSON-able settings object (keys sorted, so order does not matter)."""
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def code_hash(package: Path | None = None) -> str:
    """sha256 of the pipeline package's own Python sources (or of ``package``): part of every stage key,
    so a new quantizer or gate reruns the stages instead of reusing artifacts and verdicts of the old code."""
    return _sources_hash(package) if package is not None else _own_sources_hash()


@functools.cache
def _own_sources_hash() -> str:
    return _sources_hash(Path(__file__).resolve().parents[1])  # the package (this file sits in core/); once per process: the code does not change under it


def _sources_hash(package: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(package.rglob("*.py")):
        digest.update(file.relative_to(package).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()
