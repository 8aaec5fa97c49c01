"""Length buckets on disk: reading arrays from an ``.npz`` or a folder of ``.npy`` files, and the
sample shapes of every bucket from the array headers alone (no data loaded).

The naming of buckets (``<input>__<bucket>``: ``tokens__16``, ``labels__16``, ``tokens__20``) and
their grouping and checks are :func:`split_buckets`, the one reader that calibration data,
evaluation data and load-test samples all go through.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from collections.abc import Mapping

from pipeline.core.errors import PipelineError, require
from pipeline.data.arrays import IGNORED_KEYS, is_label_key, load_npy, load_npz, unknown_arrays_fix
from pipeline.data.tensors import ModelSignature

BUCKET_SEP = "__"  # ``tokens__16``: input ``tokens`` of bucket ``16``


def split_buckets(origin: Path, arrays: Mapping[str, np.ndarray], signature: ModelSignature, *, what: str = "calibration data") -> dict[str, dict[str, np.ndarray]]:
    """Group ``<input>`` / ``<input>__<bucket>`` arrays into buckets (``labels`` aside); each bucket
    must hold one array per model input."""
    expected = [spec.name for spec in signature.inputs]
    buckets: dict[str, dict[str, np.ndarray]] = {}
    unknown = []
    for key, arr in arrays.items():
        if is_label_key(key):
            continue
        if key in expected:
            buckets.setdefault("", {})[key] = arr
            continue
        name, sep, bucket = key.rpartition(BUCKET_SEP)
        if sep and name in expected and bucket:
            buckets.setdefault(bucket, {})[name] = arr
        else:
            unknown.append(key)
    require(
        not unknown,
        f"{what} '{origin}' has arrays {sorted(unknown)} that are not model inputs",
        unknown_arrays_fix(sorted(unknown), signature, bucketed=True),
    )
    require(
        bool(buckets),
        f"{what} '{origin}' has no array for model input(s) {expected}",
        f"add one array per model input: {', '.join(expected)}",
    )
    for bucket, group in buckets.items():
        missing = [name for name in expected if name not in group]
        label = f"bucket '{bucket}' of " if bucket else ""
        require(
            not missing,
            f"{what} {label}'{origin}' has no array for model input(s) {missing}",
            f"add one array per model input: {', '.join(expected)}"
            + (f" (named <input>{BUCKET_SEP}{bucket})" if bucket else ""),
        )
    return dict(sorted(buckets.items()))


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, or of a folder of ``.npy`` files (memory-mapped, keyed by
    file stem: ``tokens__16.npy`` → ``tokens__16``)."""
    path = Path(path)
    if path.is_file():
        require(path.suffix == ".npz", f"'{path}' is not an .npz archive", "pass an .npz file or a folder of .npy files")
        return load_npz(path)
    require(path.is_dir(), f"'{path}' does not exist", "pass an .npz file or a folder of .npy files")
    files = sorted(f for f in path.iterdir() if f.is_file() and not f.name.startswith(".") and f.suffix == ".npy")
    require(bool(files), f"folder '{path}' holds no .npy files", f"add one <input>.npy (or <input>{BUCKET_SEP}<bucket>.npy) per model input")
    return {f.stem: load_npy(f) for f in files}


def array_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Shape of every array of an ``.npz`` file or a folder of ``.npy`` files, read from the
    headers only (no array data is loaded)."""
    return {key: shape for key, (shape, _) in array_headers(path).items()}


def array_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array of an ``.npz`` file or a folder of ``.npy`` files, read from the
    headers only (no array data is loaded)."""
    path = Path(path)
    if path.is_dir():
        return {key: (tuple(arr.shape), arr.dtype) for key, arr in read_arrays(path).items()}  # memory-mapped
    require(path.exists(), f"'{path}' does not exist", "pass an .npz file or a folder of .npy files")
    require(path.suffix == ".npz" and path.is_file(), f"'{path}' is not an .npz archive", "pass an .npz file or a folder of .npy files")
    headers = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    continue
                with archive.open(member) as fh:
                    version = np.lib.format.read_magic(fh)
                    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                    shape, _, dtype = reader(fh)
                headers[member[: -len(".npy")]] = (tuple(int(d) for d in shape), np.dtype(dtype))
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise PipelineError(f"cannot read '{path}': {exc}", "write it again with numpy.savez") from None
    return headers


def sample_shapes(path: Path, signature: ModelSignature, *, what: str = "calibration data") -> list[tuple[str, dict[str, tuple[int, ...]], int]]:
    """Per length bucket of an ``.npz`` or ``.npy`` folder: where it is, each input's per-sample
    shape, and the sample count — from the array headers, no data loaded."""
    shapes = array_shapes(path)
    fake = {key: np.empty((0,)) for key in shapes}  # split_buckets only reads the keys
    result = []
    for label, group in split_buckets(path, fake, signature, what=what).items():
        where = f"{path}[{label}]" if label else str(path)
        per_input = {name: shapes[name + (f"{BUCKET_SEP}{label}" if label else "")] for name in group if name not in IGNORED_KEYS}
        result.append((where, {name: shape[1:] for name, shape in per_input.items()}, min((s[0] for s in per_input.values() if s), default=0)))
    return result
