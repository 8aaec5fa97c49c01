"""Length buckets: model-input arrays whose samples differ in size on a dynamic axis (token
sequences of length 16 and 20, say), stored without padding as one array per input and bucket.

Naming (the same for calibration and evaluation data, in an ``.npz`` or as ``.npy`` files in a
folder): ``<input>__<bucket>`` — ``tokens__16``, ``labels__16``, ``tokens__20``, ``labels__20``.
Every bucket holds one array per input (and, for evaluation data, its labels); within a bucket
all samples share their shape. Data without any ``__<bucket>`` name is one bucket, ``""``.
"""

from __future__ import annotations

import zipfile
from collections.abc import Collection, Mapping
from pathlib import Path

import numpy as np

from pipeline.arrays import IGNORED_KEYS, checked_inputs, load_npy, load_npz
from pipeline.errors import PipelineError, require
from pipeline.tensors import ModelSignature

BUCKET_SEP = "__"  # ``tokens__16``: input ``tokens`` of bucket ``16`` (any label after the last ``__``)


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, or of a folder of ``.npy`` files (memory-mapped, keyed by
    file stem). Keys may carry a length bucket: ``<input>__<bucket>`` (see :func:`split_buckets`)."""
    path = Path(path)
    if path.is_file():
        require(path.suffix == ".npz", f"'{path}' is not an .npz archive", "pass an .npz file or a folder of .npy files")
        return load_npz(path)
    require(path.is_dir(), f"'{path}' does not exist", "pass an .npz file or a folder of .npy files")
    files = sorted(f for f in path.iterdir() if f.is_file() and not f.name.startswith(".") and f.suffix == ".npy")
    require(bool(files), f"folder '{path}' holds no .npy files", "add one <input>.npy (or <input>__<bucket>.npy) per model input")
    return {f.stem: load_npy(f) for f in files}


def split_buckets(origin: Path | str, arrays: Mapping[str, np.ndarray], names: Collection[str] = ()) -> dict[str, dict[str, np.ndarray]]:
    """Group arrays by length bucket: ``{"tokens__16": a, "labels__16": b, "tokens__20": c}`` →
    ``{"16": {"tokens": a, "labels": b}, "20": {"tokens": c}}``. Keys that are exactly one of
    ``names`` (the model's input names) or ``labels`` are never split. Without any bucketed key,
    one bucket named ``""``. Buckets differ only in the sizes of dynamic axes, so no sample is
    ever padded."""
    plain_names = {*names, *IGNORED_KEYS}
    bucketed = [key for key in arrays if BUCKET_SEP in key and key not in plain_names]
    if not bucketed:
        return {"": dict(arrays)}
    plain = sorted(set(arrays) - set(bucketed))
    require(
        not plain,
        f"'{origin}' mixes bucketed arrays ({bucketed[0]}) with arrays without a bucket ({', '.join(plain)})",
        f"name every array <input>{BUCKET_SEP}<bucket> (e.g. tokens{BUCKET_SEP}16, labels{BUCKET_SEP}16), or none",
    )
    buckets: dict[str, dict[str, np.ndarray]] = {}
    for key in sorted(bucketed, key=_natural):
        name, _, label = key.rpartition(BUCKET_SEP)
        require(bool(name and label), f"'{origin}' has an array named '{key}'", f"name bucketed arrays <input>{BUCKET_SEP}<bucket>, e.g. tokens{BUCKET_SEP}16")
        buckets.setdefault(label, {})[name] = arrays[key]
    return buckets


def checked_buckets(
    origin: Path,
    arrays: Mapping[str, np.ndarray],
    signature: ModelSignature,
    *,
    what: str,
    hints: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """:func:`split_buckets`, then :func:`checked_inputs` on every bucket (``labels`` kept aside)."""
    checked = {}
    for label, bucket in split_buckets(origin, arrays, [s.name for s in signature.inputs]).items():
        where = Path(f"{origin}[{label}]") if label else origin
        inputs = checked_inputs(where, bucket, signature, what=what, hints=hints)
        checked[label] = {**inputs, **{k: bucket[k] for k in IGNORED_KEYS if k in bucket}}
    return checked


def array_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Shape of every array of an ``.npz`` file or a folder of ``.npy`` files, read from the
    headers only (no array data is loaded)."""
    path = Path(path)
    if path.is_dir():
        return {key: tuple(arr.shape) for key, arr in read_arrays(path).items()}  # memory-mapped
    require(path.suffix == ".npz" and path.is_file(), f"'{path}' is not an .npz archive", "pass an .npz file or a folder of .npy files")
    shapes = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    continue
                with archive.open(member) as fh:
                    version = np.lib.format.read_magic(fh)
                    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                    shape, _, _ = reader(fh)
                shapes[member[: -len(".npy")]] = tuple(int(d) for d in shape)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise PipelineError(f"cannot read '{path}': {exc}", "write it again with numpy.savez") from None
    return shapes


def _natural(key: str) -> tuple:
    """Bucket order: ``__8`` before ``__16`` (numeric labels by value), then the array name."""
    name, _, label = key.rpartition(BUCKET_SEP)
    return (0, int(label), "", name) if label.isdigit() else (1, 0, label, name)


def sample_shapes(path: Path, names: Collection[str] = ()) -> list[tuple[str, dict[str, tuple[int, ...]], int]]:
    """Per length bucket of an ``.npz`` or ``.npy`` folder: where it is, each array's per-sample
    shape, and the sample count — from the array headers, no data loaded."""
    shapes = array_shapes(path)
    result = []
    for label, bucket in split_buckets(path, shapes, names).items():
        counts = {shape[0] for key, shape in bucket.items() if key not in IGNORED_KEYS and shape}
        where = f"{path}[{label}]" if label else str(path)
        result.append((where, {key: tuple(shape[1:]) for key, shape in bucket.items() if key not in IGNORED_KEYS and shape}, min(counts, default=0)))
    return result
