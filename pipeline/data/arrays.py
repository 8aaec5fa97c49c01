"""Arrays of model inputs from .npz/.npy files: read safely (never unpickled) and checked against
the model's inputs. Calibration data and evaluation data both come through here.

Samples of different sizes on a dynamic axis come in length buckets (``<input>__<bucket>``,
see :mod:`pipeline.data.buckets`); each bucket is checked here like a plain set of arrays.
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError, require
from pipeline.data.tensors import Dim, ModelSignature, TensorSpec

log = logging.getLogger(__name__)

IGNORED_KEYS = ("labels",)  # eval.npz keeps labels beside the inputs (also ``labels:<output>``, see is_label_key)
PerSample = tuple[int, ...]


def is_label_key(key: str) -> bool:
    """``labels``, ``labels:<output>`` and their bucketed forms (``labels:<output>__16``) hold labels, not inputs."""
    base = key.split("__", 1)[0]
    return base in IGNORED_KEYS or base.startswith("labels:")


def unknown_arrays_fix(unknown: list[str], signature: ModelSignature, bucketed: bool = False) -> str:
    """The fix for arrays that are not model inputs: an array named after an output holds that output's
    labels, which go under ``labels:<output>``; any other is told the input names."""
    outputs = {spec.name for spec in signature.outputs}
    targets = [k for k in unknown if k.split("__", 1)[0] in outputs]
    if targets:
        return "rename " + ", ".join(f"'{k}' to 'labels:{k}'" for k in targets) + ": an output's labels go under labels:<output> (docs/guide/data.md)"
    names = ", ".join(spec.name for spec in signature.inputs)
    return f"name the arrays after the model inputs: {names}" + (" (or <input>__<bucket> for samples of another size)" if bucketed else "")


_SCAN_CHUNK = 256  # samples per chunk when scanning (possibly memory-mapped) arrays for NaN/range


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (no pickles); a damaged or pickled file is one PipelineError."""
    # np.load falls back to unpickling anything that is not a zip/npy file; check the magic first
    # so a damaged file is reported as such, not as "pickled data".
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise PipelineError(f"cannot read '{path}': {exc.strerror or exc}", "pass an existing, readable .npz file") from None
    require(
        magic == b"PK\x03\x04",
        f"'{path}' is not a valid .npz archive (damaged or not written by numpy.savez)",
        "write it again with numpy.savez or numpy.savez_compressed",
    )
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except ValueError as exc:
        raise _pickle_error(path, exc) from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise PipelineError(f"cannot read '{path}': {exc}", "write it again with numpy.savez") from None


def load_npy(path: Path) -> np.ndarray:
    """An ``.npy`` array, memory-mapped (no pickles)."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise _pickle_error(path, exc) from None
    except (OSError, EOFError) as exc:
        raise PipelineError(f"cannot read '{path}': {exc}", "write it again with numpy.save") from None


def _pickle_error(path: Path, exc: ValueError) -> PipelineError:
    text = str(exc)
    if "pickle" in text or "object" in text.lower():
        return PipelineError(
            f"'{path}' holds a pickled object array, which is not loaded for safety",
            "save plain numeric arrays (e.g. x.astype(np.float32)) with numpy.savez / numpy.save",
        )
    return PipelineError(f"cannot read '{path}': {text}", "write it again with numpy.savez / numpy.save")


def checked_inputs(
    origin: Path,
    arrays: Mapping[str, np.ndarray],
    signature: ModelSignature,
    *,
    what: str = "calibration data",
    hints: Mapping[str, tuple[int, ...]] | None = None,
    bounds: Mapping[str, tuple[PerSample, PerSample]] | None = None,
) -> dict[str, np.ndarray]:
    """Check arrays against the model inputs: names (``labels`` aside), rank, fixed dims, dtype
    kind, value range, NaN/Inf and equal sample counts. ``what`` names the data in messages.

    ``hints`` fixes the per-sample size of dynamic axes exactly; ``bounds`` gives a per-sample
    (min, max) shape those sizes must lie in (a shape profile). Dynamic axes that share a name
    across inputs (``seq`` of tokens and mask) must agree. Float arrays wider than the model's
    float type (float64 for float32) are accepted and cast, with one line saying so."""
    expected = [spec.name for spec in signature.inputs]
    unknown = sorted(k for k in set(arrays) - set(expected) if not is_label_key(k))
    require(
        not unknown,
        f"{what} '{origin}' has arrays {unknown} that are not model inputs",
        unknown_arrays_fix(unknown, signature),
    )
    missing = [name for name in expected if name not in arrays]
    require(
        not missing,
        f"{what} '{origin}' has no array for model input(s) {missing}",
        f"add one array per model input: {', '.join(expected)}",
    )
    hints = hints or {}
    checked = {spec.name: _checked_array(origin, arrays[spec.name], spec, hints.get(spec.name)) for spec in signature.inputs}
    counts = {name: len(arr) for name, arr in checked.items()}
    require(
        len(set(counts.values())) == 1,
        f"{what} inputs in '{origin}' have different sample counts: {counts}",
        "give every input the same number of samples (first axis)",
    )
    _check_shared_axes(origin, checked, signature, what)
    for spec in signature.inputs:
        if spec.name in (bounds or {}):
            _check_bounds(origin, checked[spec.name], spec, bounds[spec.name], what)  # type: ignore[index]
        arr = checked[spec.name]
        if arr.dtype.kind == "f" and spec.dtype.kind == "f" and arr.dtype.itemsize > spec.dtype.itemsize:
            log.info("%s '%s': input '%s' is %s, cast to the model's %s", what, origin, spec.name, arr.dtype, spec.dtype)
    return checked


def _check_shared_axes(origin: Path, checked: Mapping[str, np.ndarray], signature: ModelSignature, what: str) -> None:
    """Inputs whose dynamic axes carry the same name (one sequence length) must agree on their size."""
    seen: dict[str, tuple[str, int, int]] = {}
    for spec in signature.inputs:
        for axis, dim in enumerate(spec.shape):
            if axis == 0 or not isinstance(dim, str) or dim in ("batch", "?", ""):
                continue
            size = int(checked[spec.name].shape[axis])
            if dim in seen and seen[dim][2] != size:
                other, other_axis, other_size = seen[dim]
                raise PipelineError(
                    f"{what} '{origin}': input '{spec.name}' has dim {axis} = {size} but '{other}' has dim {other_axis} = {other_size}, "
                    f"and the model says both are the same axis '{dim}'",
                    "give the inputs of each sample (or bucket) the same size on that axis",
                )
            seen.setdefault(dim, (spec.name, axis, size))


def _check_bounds(origin: Path, arr: np.ndarray, spec: TensorSpec, bounds: tuple[PerSample, PerSample], what: str) -> None:
    low, high = bounds
    for axis in range(1, arr.ndim):
        size = int(arr.shape[axis])
        lo, hi = low[axis - 1], high[axis - 1]
        require(
            lo <= size <= hi,
            f"{what} '{origin}': input '{spec.name}' has dim {axis} = {size}, outside the shape profile's {lo}..{hi}",
            f"widen the profile with --shape {spec.name}:MIN/OPT/MAX to cover {size}, or drop those samples",
        )


def fmt_shape(dims: tuple[Dim, ...] | list[Dim]) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


def _checked_array(origin: Path, arr: np.ndarray, spec: TensorSpec, hint: tuple[int, ...] | None) -> np.ndarray:
    """Check rank, fixed dims, dtype kind, value range and finiteness of one input's samples."""
    where = f"input '{spec.name}' in '{origin}'"
    expected = ("N", *spec.shape[1:])
    require(
        arr.ndim == len(spec.shape),
        f"{where} has shape {fmt_shape(arr.shape)}, the model expects {fmt_shape(expected)} (N = samples)",
        "store one sample per row of the first axis, each with the model input's shape",
    )
    if hint is not None:
        require(
            len(hint) == arr.ndim - 1,
            f"the shape hint {fmt_shape(hint)} for '{spec.name}' has rank {len(hint)}, the input has {arr.ndim - 1} per-sample dims",
            "give the per-sample shape without the batch axis",
        )
    for axis in range(1, arr.ndim):
        want = spec.shape[axis]
        fixed = want if isinstance(want, int) and want > 0 else (hint[axis - 1] if hint else None)
        require(
            fixed is None or arr.shape[axis] == fixed,
            f"{where} has shape {fmt_shape(arr.shape)}, the model expects {fmt_shape(expected)} (N = samples)"
            + (f" with dim {axis} = {fixed} from the shape hint" if fixed != want else ""),
            "resize or reshape the samples to the model input's shape",
        )

    if len(arr) == 0:
        return arr  # the sample count check reports it
    kind, want_kind = arr.dtype.kind, spec.dtype.kind
    kinds = {"f": "f", "i": "iu", "u": "iu", "b": "b"}
    require(
        kind in kinds.get(want_kind, want_kind),
        f"{where} is {arr.dtype}, but the model input is {spec.dtype}",
        f"store {spec.dtype} samples (float for float inputs, integer for integer inputs), "
        f"preprocessed as the model expects",
    )
    if want_kind in "iu" and arr.dtype != spec.dtype:
        info = np.iinfo(spec.dtype)
        lo, hi = _scan(arr, lambda c: (c.min(), c.max()), lambda a, b: (min(a[0], b[0]), max(a[1], b[1])))
        require(
            info.min <= lo and hi <= info.max,
            f"{where} has values {lo}..{hi} that do not fit the model's {spec.dtype}",
            f"keep the values within {info.min}..{info.max}",
        )
    if want_kind == "f":
        with np.errstate(over="ignore"):  # values beyond the model's float range become inf: counted
            bad = _scan(arr, lambda c: int(np.count_nonzero(~np.isfinite(c.astype(spec.dtype)))), lambda a, b: a + b)
        require(
            bad == 0,
            f"{where} has {bad} NaN/Inf value(s)",
            "replace or drop the samples with NaN/Inf (check the preprocessing)",
        )
    return arr


def _scan(arr: np.ndarray, reduce: Callable, combine: Callable):
    """Fold ``reduce`` over chunks of samples, so memory-mapped arrays are never fully loaded."""
    result = None
    for start in range(0, len(arr), _SCAN_CHUNK):
        value = reduce(np.asarray(arr[start : start + _SCAN_CHUNK]))
        result = value if result is None else combine(result, value)
    return result
