"""Labeled evaluation data: `eval.npz` (one array per model input name, plus ``labels``), or a
folder of ``.npy`` files with the same names.

Samples of different sizes on a dynamic axis (token sequences of length 16 and 20, say) come in
length buckets, as calibration data does: ``tokens__16``, ``labels__16``, ``tokens__20``,
``labels__20`` (see :mod:`pipeline.buckets`). Batches never mix buckets, so no sample is ever
padded; labels are kept in bucket order.

When a model has no evaluation data, parity runs on seeded synthetic samples (floats in
[0, 1), integer ids in [0, 2) so any embedding accepts them); accuracy gates then compare
against FP32 only, as there are no labels.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.arrays import checked_inputs
from pipeline.buckets import BUCKET_SEP, read_arrays, split_buckets
from pipeline.errors import PipelineError
from pipeline.fingerprint import hash_path
from pipeline.tensors import ModelSignature


@dataclass(frozen=True)
class EvalBucket:
    """Samples of one size: every input (first axis = sample) and optional int labels."""

    name: str  # the bucket label after '__' ("" when the data has no buckets)
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None

    @property
    def num_samples(self) -> int:
        return len(next(iter(self.inputs.values())))


@dataclass(frozen=True)
class EvalData:
    """Evaluation samples in one or more length buckets."""

    buckets: tuple[EvalBucket, ...]
    source: str
    fingerprint: str  # what the stage cache keys on
    synthetic: bool = False  # made up: says nothing about the sizes a deployment sees

    @classmethod
    def single(cls, inputs: dict[str, np.ndarray], labels: np.ndarray | None, source: str, fingerprint: str) -> EvalData:
        """Evaluation data of one size (one bucket)."""
        return cls((EvalBucket("", inputs, labels),), source, fingerprint)

    @property
    def num_samples(self) -> int:
        return sum(b.num_samples for b in self.buckets)

    @property
    def labels(self) -> np.ndarray | None:
        """Labels of every sample, in the order :meth:`batches` yields them (None without labels)."""
        if any(b.labels is None for b in self.buckets):
            return None
        return np.concatenate([b.labels for b in self.buckets])  # type: ignore[misc]

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """Every input's samples, for data of a single size (one bucket)."""
        if len(self.buckets) != 1:
            raise PipelineError(
                f"evaluation data {self.source} holds {len(self.buckets)} length buckets, which cannot be stacked",
                "iterate over .batches() or .buckets instead",
            )
        return self.buckets[0].inputs

    def num_batches(self, batch_size: int) -> int:
        """How many feed dicts :meth:`batches` yields (batches never span buckets)."""
        return sum(-(-b.num_samples // batch_size) for b in self.buckets)

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """Yield feed dicts of at most ``batch_size`` samples of one bucket, bucket by bucket, in order."""
        for bucket in self.buckets:
            for start in range(0, bucket.num_samples, batch_size):
                yield {k: v[start : start + batch_size] for k, v in bucket.inputs.items()}

    def head(self, count: int) -> dict[str, np.ndarray]:
        """The first ``count`` samples of the largest bucket (the most common size)."""
        bucket = max(self.buckets, key=lambda b: b.num_samples)
        return {k: v[:count] for k, v in bucket.inputs.items()}

    def sample_shapes(self) -> list[tuple[str, dict[str, tuple[int, ...]], int]]:
        """Per bucket: where it came from, each input's per-sample shape, and its sample count."""
        return [
            (f"{self.source}" + (f"[{b.name}]" if b.name else ""), {k: tuple(v.shape[1:]) for k, v in b.inputs.items()}, b.num_samples)
            for b in self.buckets
        ]


def eval_data_from_path(path: Path, signature: ModelSignature) -> EvalData:
    """Load and check evaluation data (an ``.npz`` or a folder of ``.npy`` files) against the
    model's inputs (names, rank, fixed dims, dtype kind), bucket by bucket; ``labels`` (or
    ``labels__<bucket>``) beside the inputs of each bucket."""
    path = Path(path)
    arrays = read_arrays(path)
    groups = split_buckets(path, arrays, signature, what="evaluation data")
    keys = {("labels" + (f"{BUCKET_SEP}{name}" if name else "")): name for name in groups}
    stray = sorted(k for k in arrays if (k == "labels" or k.startswith(f"labels{BUCKET_SEP}")) and k not in keys)
    if stray:
        raise PipelineError(f"evaluation data '{path}' has {stray} but no inputs of that bucket", f"name labels after their bucket: labels{BUCKET_SEP}<bucket>")
    buckets = []
    for name in sorted(groups, key=_natural):
        where = Path(f"{path}[{name}]") if name else path
        checked = checked_inputs(where, groups[name], signature, what="evaluation data")
        inputs = {spec.name: np.ascontiguousarray(checked[spec.name], dtype=spec.dtype) for spec in signature.inputs}
        n = len(next(iter(inputs.values())))
        key = "labels" + (f"{BUCKET_SEP}{name}" if name else "")
        labels = arrays.get(key)
        if labels is not None and (labels.ndim != 1 or len(labels) != n or labels.dtype.kind not in "iu"):
            raise PipelineError(f"'{key}' in '{path}' must be {n} integers (one per sample)", "store class indices as int64")
        buckets.append(EvalBucket(name, inputs, None if labels is None else np.asarray(labels, dtype=np.int64)))
    with_labels = [b.name for b in buckets if b.labels is not None]
    if with_labels and len(with_labels) != len(buckets):
        missing = [b.name for b in buckets if b.labels is None]
        raise PipelineError(
            f"evaluation data '{path}' has labels for buckets {with_labels} but not for {missing}",
            f"add labels{BUCKET_SEP}<bucket> for every bucket, or none",
        )
    return EvalData(tuple(buckets), str(path), hash_path(path))


def _natural(label: str) -> tuple:
    """Bucket order: ``8`` before ``16`` (numeric labels by value), then other labels."""
    return (0, int(label), "") if label.isdigit() else (1, 0, label)


def eval_data_from_npz(path: Path, signature: ModelSignature) -> EvalData:
    """:func:`eval_data_from_path` for an ``eval.npz`` (kept for callers that name the format)."""
    return eval_data_from_path(path, signature)


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
    return EvalData((EvalBucket("", inputs, None),), source, source, synthetic=True)
