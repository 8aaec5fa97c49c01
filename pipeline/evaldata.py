"""Labeled evaluation data: `eval.npz` (one array per model input name, plus ``labels``).

When a model has no evaluation data, parity runs on seeded synthetic samples (floats in
[0, 1), integer ids in [0, 2) so any embedding accepts them); accuracy gates then compare
against FP32 only, as there are no labels.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import PipelineError
from pipeline.fingerprint import hash_path
from pipeline.tensors import ModelSignature


@dataclass(frozen=True)
class EvalData:
    """Samples for every model input (first axis = sample) and optional int labels."""

    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    source: str
    fingerprint: str  # what the stage cache keys on

    @property
    def num_samples(self) -> int:
        return len(next(iter(self.inputs.values())))

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """Yield feed dicts of at most ``batch_size`` samples, in order."""
        for start in range(0, self.num_samples, batch_size):
            yield {k: v[start : start + batch_size] for k, v in self.inputs.items()}

    def head(self, count: int) -> dict[str, np.ndarray]:
        """The first ``count`` samples of every input."""
        return {k: v[:count] for k, v in self.inputs.items()}


def eval_data_from_npz(path: Path, signature: ModelSignature) -> EvalData:
    """Load and check ``eval.npz`` against the model's inputs (names, rank, fixed dims, dtype kind)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, EOFError) as exc:
        raise PipelineError(f"cannot read evaluation data '{path}': {exc}", "write it with numpy.savez (no object arrays)") from None
    labels = arrays.pop("labels", None)
    inputs = check_inputs(arrays, signature, what=f"evaluation data '{path}'")
    n = len(next(iter(inputs.values())))
    if labels is not None and (labels.ndim != 1 or len(labels) != n or labels.dtype.kind not in "iu"):
        raise PipelineError(f"'labels' in '{path}' must be {n} integers (one per sample)", "store class indices as int64")
    return EvalData(inputs, labels.astype(np.int64) if labels is not None else None, str(path), hash_path(path))


def check_inputs(arrays: Mapping[str, np.ndarray], signature: ModelSignature, *, what: str) -> dict[str, np.ndarray]:
    """Check arrays against the model inputs and cast them to the input dtypes (within a kind)."""
    expected = [s.name for s in signature.inputs]
    missing = [n for n in expected if n not in arrays]
    unknown = [n for n in arrays if n not in expected]
    if missing or unknown:
        raise PipelineError(
            f"{what} has arrays {sorted(arrays)} but the model's inputs are {expected}",
            "store one array per model input, named exactly like the input",
        )
    out = {}
    counts = set()
    for spec in signature.inputs:
        array = arrays[spec.name]
        if array.ndim != len(spec.shape):
            raise PipelineError(
                f"{what}: '{spec.name}' has shape {array.shape} but the model expects rank {len(spec.shape)} {spec.shape}",
                "store samples along the first axis with the model's input shape",
            )
        for axis, dim in enumerate(spec.shape):
            if axis and isinstance(dim, int) and dim > 0 and array.shape[axis] != dim:
                raise PipelineError(
                    f"{what}: '{spec.name}' axis {axis} is {array.shape[axis]} but the model expects {dim} (shape {spec.shape})",
                    "resize or reshape the data to the model's input shape",
                )
        if (array.dtype.kind == "f") != (spec.dtype.kind == "f") or array.dtype.kind not in "fiub":
            raise PipelineError(
                f"{what}: '{spec.name}' is {array.dtype} but the model expects {spec.dtype}",
                "store floats for float inputs and integers for integer inputs",
            )
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int((~np.isfinite(array)).sum())
            raise PipelineError(f"{what}: '{spec.name}' has {bad} NaN/Inf values", "clean the data before using it")
        counts.add(len(array))
        out[spec.name] = array.astype(spec.dtype, copy=False)
    if len(counts) != 1:
        raise PipelineError(f"{what}: inputs have different sample counts {sorted(counts)}", "store the same number of samples for every input")
    return out


def synthetic_eval_data(signature: ModelSignature, samples: int, dynamic: Mapping[str, int] | None = None, seed: int = 0) -> EvalData:
    """Seeded samples for models without evaluation data; dynamic non-batch dims take ``dynamic`` or 8."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in signature.inputs:
        dims = [samples] + [d if isinstance(d, int) and d > 0 else (dynamic or {}).get(f"{spec.name}:{i}", 8) for i, d in enumerate(spec.shape) if i]
        if spec.dtype.kind == "f":
            inputs[spec.name] = rng.random(dims, dtype=np.float32).astype(spec.dtype)
        elif spec.dtype.kind == "b":
            inputs[spec.name] = rng.integers(0, 2, dims).astype(bool)
        else:
            inputs[spec.name] = rng.integers(0, 2, dims).astype(spec.dtype)
    source = f"synthetic (seed {seed}, {samples} samples, dynamic dims {dict(dynamic or {})})"
    return EvalData(inputs, None, source, source)
