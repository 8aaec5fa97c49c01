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

from pipeline.arrays import checked_inputs, load_npz
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
    arrays = load_npz(path)
    labels = arrays.pop("labels", None)
    checked = checked_inputs(path, arrays, signature, what="evaluation data")
    inputs = {spec.name: np.ascontiguousarray(checked[spec.name], dtype=spec.dtype) for spec in signature.inputs}
    n = len(next(iter(inputs.values())))
    if labels is not None and (labels.ndim != 1 or len(labels) != n or labels.dtype.kind not in "iu"):
        raise PipelineError(f"'labels' in '{path}' must be {n} integers (one per sample)", "store class indices as int64")
    return EvalData(inputs, labels.astype(np.int64) if labels is not None else None, str(path), hash_path(path))


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
