"""Filesystem primitives of the atomic publish (pipeline/triton/repository.py): directory swaps with
``renameat2``, the per-repository lock, hard-link carry-over, and fsync'd writes."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.core.errors import PipelineError, require
from pipeline.core.onnx_files import copy_onnx, onnx_files

_AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}


def renameat2(src: Path, dst: Path, flags: int) -> None:
    """``renameat2(2)``: with RENAME_EXCHANGE swap two directories, with RENAME_NOREPLACE move without overwriting."""
    libc = ctypes.CDLL(None, use_errno=True)
    if hasattr(libc, "renameat2"):
        result = libc.renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), ctypes.c_uint(flags))
    else:  # glibc < 2.28: call the system call directly
        number = _SYS_RENAMEAT2.get(os.uname().machine)
        require(number is not None, f"no renameat2 on {os.uname().machine}", "publish on Linux x86_64 or aarch64 with glibc 2.28+")
        result = libc.syscall(number, _AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), ctypes.c_uint(flags))
    if result != 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise PipelineError(
                f"the filesystem of {dst.parent} cannot swap directories atomically (renameat2: {os.strerror(err)})",
                "put the model repository on a local Linux filesystem (ext4, xfs, btrfs, tmpfs)",
            )
        raise OSError(err, f"renameat2 {src} -> {dst}: {os.strerror(err)}")


@contextmanager
def publish_lock(repository: Path) -> Iterator[None]:
    """Hold the exclusive publish lock of ``repository`` (an flock on the directory)."""
    # One publisher per repository; the kernel drops the lock if the process dies.
    fd = os.open(repository, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def carry_over(src: Path, dst: Path, rel: str, *, skip_files: set[str], skip_dirs: set[str]) -> bool:
    """Hard-link (or copy) ``src`` into ``dst`` minus skipped paths; True if ``dst`` was created."""
    created = False
    entries = sorted(os.scandir(src), key=lambda e: e.name)
    if not entries and rel:  # keep empty folders someone made
        dst.mkdir(parents=True)
        return True
    for entry in entries:
        child_rel = f"{rel}{entry.name}"
        target = dst / entry.name
        if entry.is_dir(follow_symlinks=False):
            if child_rel in skip_dirs:
                continue
            if carry_over(Path(entry.path), target, child_rel + "/", skip_files=skip_files, skip_dirs=skip_dirs):
                created = True
            continue
        if child_rel in skip_files:
            continue
        dst.mkdir(parents=True, exist_ok=True)
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        else:
            try:
                os.link(entry.path, target)
            except OSError:
                shutil.copy2(entry.path, target)
        created = True
    return created


def copy_artifact(src: Path, dst: Path) -> None:
    """Copy a model file (an ONNX model with its data file, ``<dst>.data``; or a folder) and fsync every file."""
    if src.is_dir():
        shutil.copytree(src, dst)
        for file in dst.rglob("*"):
            if file.is_file():
                fsync(file)
    elif src.suffix == ".onnx":
        copy_onnx(src, dst)
        for file in onnx_files(dst):
            fsync(file)
    else:
        shutil.copyfile(src, dst)
        fsync(dst)


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (creating its folder) and fsync it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def fsync(path: Path) -> None:
    """fsync a file or directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dirs(root: Path) -> None:
    """fsync ``root`` and every folder under it (so renames and new entries are durable)."""
    for folder, _, _ in os.walk(root):
        fsync(Path(folder))
