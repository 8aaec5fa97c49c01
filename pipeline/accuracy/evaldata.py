"""Labeled evaluation data: `eval.npz` (one array per model input name, plus labels), or a
folder of ``.npy`` files with the same names.

Labels belong to an output: ``labels:<output>`` (``labels:class_probs``, ``labels:box``), or plain
``labels`` for a model with one output (or for its first class-score output). What a label is
depends on the output's kind (pipeline.accuracy.outputkinds): class indices (integers in [0, K)) for
``classes``; 0/1 per sample for ``binary`` and per class for ``multilabel``; float targets shaped
like the output for ``regression``; an integer class map (the output's shape without its class
axis) for ``segmentation``. :func:`check_targets` holds them to that, before any model runs.

Samples of different sizes on a dynamic axis (token sequences of length 16 and 20, say) come in
length buckets, as calibration data does: ``tokens__16``, ``labels__16``, ``tokens__20``,
``labels__20`` (see :mod:`pipeline.data.buckets`). Batches never mix buckets, so no sample is ever
padded; labels are kept in bucket order.

When a model has no evaluation data, parity runs on seeded synthetic samples (floats in
[0, 1), integer ids in [0, 2) so any embedding accepts them); accuracy gates then compare
against FP32 only, as there are no labels.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.fingerprint import hash_path
from pipeline.data.arrays import checked_inputs, is_label_key
from pipeline.data.buckets import BUCKET_SEP, read_arrays, split_buckets
from pipeline.data.tensors import ModelSignature


UNNAMED = ""  # the target key of a plain ``labels`` array, until it is given to an output


@dataclass(frozen=True)
class EvalBucket:
    """Samples of one size: every input (first axis = sample) and the labels of the outputs that have them."""

    name: str  # the bucket label after '__' ("" when the data has no buckets)
    inputs: dict[str, np.ndarray]
    targets: Mapping[str, np.ndarray] = field(default_factory=dict)  # output name (UNNAMED: plain 'labels') → labels

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
        """Evaluation data of one size (one bucket), with plain ``labels`` or none."""
        return cls((EvalBucket("", inputs, {} if labels is None else {UNNAMED: labels}),), source, fingerprint)

    @property
    def num_samples(self) -> int:
        return sum(b.num_samples for b in self.buckets)

    @property
    def labels(self) -> np.ndarray | None:
        """Plain ``labels`` of every sample, in the order :meth:`batches` yields them (None without them)."""
        if any(UNNAMED not in b.targets for b in self.buckets):
            return None
        return np.concatenate([b.targets[UNNAMED] for b in self.buckets])

    @property
    def target_names(self) -> list[str]:
        """The outputs the data has labels for (UNNAMED for plain ``labels`` not yet given to an output)."""
        return sorted({k for b in self.buckets for k in b.targets})

    def targets_of(self, name: str) -> np.ndarray | None:
        """The labels of one output over the largest bucket (what :func:`check_targets` inspects)."""
        bucket = max(self.buckets, key=lambda b: b.num_samples)
        return bucket.targets.get(name)

    def with_targets_named(self, output: str) -> EvalData:
        """The same data with plain ``labels`` given to ``output``."""
        buckets = tuple(replace(b, targets={(output if k == UNNAMED else k): v for k, v in b.targets.items()}) for b in self.buckets)
        return replace(self, buckets=buckets)

    def target_batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """The labels of each batch :meth:`batches` yields, output by output, in step with it."""
        for bucket in self.buckets:
            for start in range(0, bucket.num_samples, batch_size):
                yield {k: v[start : start + batch_size] for k, v in bucket.targets.items()}

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

    def with_inputs(self, change: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], how: str) -> EvalData:
        """The same samples and labels with every bucket's inputs passed through ``change`` (``how`` says
        what it did, in the source and the fingerprint)."""
        buckets = tuple(replace(b, inputs=change(b.inputs)) for b in self.buckets)
        return replace(self, buckets=buckets, source=f"{self.source} ({how})", fingerprint=f"{self.fingerprint}+{how}")

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
    targets = label_arrays(path, arrays)
    stray = sorted(_label_key(key, bucket) for key, bucket in targets if bucket not in groups)
    if stray:
        raise PipelineError(f"evaluation data '{path}' has {stray} but no inputs of that bucket", f"name labels after their bucket: labels{BUCKET_SEP}<bucket>")
    buckets = []
    for name in sorted(groups, key=_natural):
        where = Path(f"{path}[{name}]") if name else path
        checked = checked_inputs(where, groups[name], signature, what="evaluation data")
        inputs = {spec.name: np.ascontiguousarray(checked[spec.name], dtype=spec.dtype) for spec in signature.inputs}
        n = len(next(iter(inputs.values())))
        if not n:
            raise PipelineError(f"evaluation data '{where}' holds no samples", "write at least one sample per input (a few hundred to decide a gate)")
        mine = {key: array for (key, bucket), array in targets.items() if bucket == name}
        for key, array in mine.items():
            if len(array) != n:
                raise PipelineError(f"'{_label_key(key, name)}' in '{path}' has {len(array)} samples but the inputs have {n}", "give one label per sample")
        buckets.append(EvalBucket(name, inputs, {key: _as_target(array) for key, array in mine.items()}))
    keys = {k for b in buckets for k in b.targets}
    for key in sorted(keys):
        missing = [b.name for b in buckets if key not in b.targets]
        if missing:
            have = [b.name for b in buckets if key in b.targets]
            raise PipelineError(f"evaluation data '{path}' has labels for buckets {have} but not for {missing}",
                                f"add {_label_key(key, '<bucket>')} for every bucket, or none")
    return EvalData(tuple(buckets), str(path), hash_path(path))


def label_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> dict[tuple[str, str], np.ndarray]:
    """The label arrays of evaluation data, keyed by (output name or UNNAMED, bucket), each checked
    to be numbers and finite: what can be said of labels before the model is known."""
    found = {}
    for key, array in arrays.items():
        if not is_label_key(key):
            continue
        head, _, bucket = key.partition(BUCKET_SEP)
        output = head.partition(":")[2] if ":" in head else UNNAMED
        if ":" in head and not output:
            raise PipelineError(f"label array '{key}' in '{path}' names no output", "name label arrays labels:<output name>")
        array = np.asarray(array)
        if array.dtype.kind not in "iubf" or array.ndim == 0:
            raise PipelineError(f"label array '{key}' in '{path}' holds {array.dtype} {array.shape}",
                                "store class indices as integers, regression targets as floats, one row per sample")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise PipelineError(f"label array '{key}' in '{path}' has {int((~np.isfinite(array)).sum())} NaN/Inf values",
                                "drop those samples or fill their targets")
        found[(output, bucket)] = array
    return found


def _label_key(output: str, bucket: str) -> str:
    return "labels" + (f":{output}" if output else "") + (f"{BUCKET_SEP}{bucket}" if bucket else "")


def _as_target(array: np.ndarray) -> np.ndarray:
    return np.asarray(array, dtype=np.float32 if array.dtype.kind == "f" else np.int64)


OutputInfo = tuple[tuple, str, "int | None"]  # per-sample shape (no batch axis), kind, classes


def plain_labels_owner(names: Sequence[str], outputs: Mapping[str, OutputInfo], where: str) -> str | None:
    """The output plain ``labels`` belong to (None when the data has none): the only output, else
    the first ``classes`` output."""
    if UNNAMED not in names:
        return None
    owner = next(iter(outputs)) if len(outputs) == 1 else next((n for n, (_, kind, _) in outputs.items() if kind == "classes"), None)
    if owner is None:
        raise PipelineError(f"evaluation data {where} has plain 'labels' but the model has {len(outputs)} outputs and no class-score output",
                            f"name the output they belong to: labels:<output> (outputs: {', '.join(outputs)})")
    if owner in names:
        raise PipelineError(f"evaluation data {where} has both 'labels' and 'labels:{owner}'", "keep one of them")
    return owner


def check_targets(targets: Mapping[str, np.ndarray], outputs: Mapping[str, OutputInfo], where: str) -> None:
    """Check every output's labels against its kind: ``targets`` maps an output name (UNNAMED for plain
    ``labels``) to its labels, ``outputs`` each output to (per-sample shape, kind, classes). Labels of an
    output the model does not have, of the wrong shape, or outside the output's classes are one error each."""
    owner = plain_labels_owner(list(targets), outputs, where)
    for name, target in targets.items():
        name = owner if name == UNNAMED else name  # type: ignore[assignment]
        if name not in outputs:
            close = difflib.get_close_matches(name, list(outputs), n=1)
            raise PipelineError(f"evaluation data {where} has labels for '{name}', which is not an output of the model (outputs: {', '.join(outputs)})",
                                f"rename the array to labels:{close[0]}" if close else "name label arrays labels:<output name>")
        shape, kind, classes = outputs[name]
        _check_target(name, target, shape, kind, classes, where)


def _check_target(name: str, target: np.ndarray, shape: tuple, kind: str, classes: int | None, where: str) -> None:
    per_sample = tuple(target.shape[1:])
    label = f"labels of output '{name}' ({kind}) in {where}"
    if not len(target):
        raise PipelineError(f"{label} hold no samples", "write at least one labelled sample (a few hundred to decide a gate)")

    def fits(expected: tuple) -> bool:
        return len(per_sample) == len(expected) and all(not isinstance(e, int) or e < 0 or e == g for e, g in zip(expected, per_sample))

    if kind in ("classes", "segmentation"):
        expected = tuple(shape[:-1])
        if target.dtype.kind not in "iub" or not fits(expected):
            raise PipelineError(f"{label} are {target.dtype} {per_sample} per sample; expected integer class indices shaped {expected or '()'}",
                                "store one class index per sample (per position for segmentation) as int64")
        low, high = int(target.min()), int(target.max())
        if classes and (low < 0 or high >= classes):
            raise PipelineError(f"{label} run from {low} to {high}, but the output has {classes} classes (0 to {classes - 1})",
                                "use 0-based class indices of this output" + ("; they look 1-based: subtract 1" if low >= 1 and high == classes else ""))
    elif kind in ("binary", "multilabel"):
        expected = tuple(shape)
        if not (fits(expected) or (kind == "binary" and per_sample == ())):
            one_decision = f"; or, if the output is one decision, --output-kind {name}=binary" if kind == "multilabel" and per_sample == () else ""
            raise PipelineError(f"{label} are {per_sample} per sample; expected {expected}", "store one 0/1 value per sample (per class for multilabel)" + one_decision)
        values = np.unique(target)
        if not np.isin(values, (0, 1)).all():
            raise PipelineError(f"{label} hold values other than 0 and 1 ({values[:5].tolist()}…)", "store decisions as 0/1")
    elif kind == "regression":
        fixed = all(isinstance(d, int) and d > 0 for d in shape)
        if not (fits(tuple(shape)) or (fixed and math.prod(shape) == math.prod(per_sample))):
            raise PipelineError(f"{label} are {per_sample} per sample; expected the output's shape {tuple(shape)}", "store one target per output value")
    else:
        raise PipelineError(f"{label}: {kind} outputs take no labels (they are judged against FP32)", f"remove labels:{name} or set --output-kind")


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
    return EvalData((EvalBucket("", inputs),), source, source, synthetic=True)
