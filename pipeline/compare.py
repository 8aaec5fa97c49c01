"""Compare models output by output on real data, streaming batch by batch through Polygraphy.

One pass feeds every batch to a reference runner and the candidates (Polygraphy's
``Comparator.run`` in streaming mode, so memory stays flat however large the data), and
accumulates per-output error statistics, top-1 agreement with the reference and, where labels
exist, task accuracy of each runner.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from polygraphy.backend.base import BaseRunner

from pipeline.errors import PipelineError

log = logging.getLogger(__name__)


@dataclass
class OutputStats:
    """Error of one output against the reference, over all samples."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    mean_abs: float = 0.0
    elements: int = 0
    mean_cosine: float = 1.0  # per sample, flattened: what non-classifier outputs are gated on
    min_cosine: float = 1.0
    rel_l2: float = 0.0  # ||out − ref|| / ||ref|| over all samples
    samples: int = 0
    _sq_diff: float = 0.0
    _sq_ref: float = 0.0

    def add(self, ref: np.ndarray, out: np.ndarray) -> None:
        ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
        diff = np.abs(out64 - ref64)
        rel = diff / np.maximum(np.abs(ref64), 1e-6)
        n = diff.size
        if n:
            self.mean_abs = (self.mean_abs * self.elements + float(diff.sum())) / (self.elements + n)
            self.max_abs = max(self.max_abs, float(diff.max()))
            self.max_rel = max(self.max_rel, float(rel.max()))
            self.elements += n
            self._sq_diff += float((diff**2).sum())
            self._sq_ref += float((ref64**2).sum())
            self.rel_l2 = (self._sq_diff / self._sq_ref) ** 0.5 if self._sq_ref > 0 else float(self._sq_diff > 0)
        if ref64.ndim >= 1 and len(ref64):
            a, b = ref64.reshape(len(ref64), -1), out64.reshape(len(out64), -1)
            norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
            same = np.all(a == b, axis=1)
            cosine = np.where(same, 1.0, (a * b).sum(axis=1) / np.where(norms > 0, norms, 1.0))
            count = len(cosine)
            self.mean_cosine = (self.mean_cosine * self.samples + float(cosine.sum())) / (self.samples + count)
            self.min_cosine = min(self.min_cosine, float(cosine.min()))
            self.samples += count

    def as_dict(self) -> dict:
        """JSON form (running sums left out)."""
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


@dataclass
class Comparison:
    """How one candidate compares with the reference."""

    runner: str
    samples: int = 0
    outputs: dict[str, OutputStats] = field(default_factory=dict)
    top1_agreement: float | None = None
    accuracy: float | None = None
    reference_accuracy: float | None = None
    worse: int = 0  # reference right, candidate wrong (labels needed)
    better: int = 0  # reference wrong, candidate right
    disagree: int = 0  # top-1 differs from the reference
    _agree: int = 0
    _correct: int = 0
    _ref_correct: int = 0

    def as_dict(self) -> dict:
        """JSON form (running counters left out)."""
        data = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        data["outputs"] = {k: v.as_dict() for k, v in self.outputs.items()}
        return data


def compare_runners(
    reference: BaseRunner,
    candidates: Sequence[BaseRunner],
    batches: Iterable[dict[str, np.ndarray]],
    *,
    labels: np.ndarray | None = None,
    classifier_output: str | None = None,
) -> list[Comparison]:
    """Run ``reference`` and ``candidates`` on every batch; return one Comparison per candidate.

    ``classifier_output`` names the output whose argmax is the predicted class (top-1 agreement and,
    with ``labels`` aligned to the batches' samples, accuracy).
    """
    from polygraphy.comparator import Comparator

    results = {c.name: Comparison(c.name) for c in candidates}
    offset = 0
    stream = Comparator.run([reference, *candidates], data_loader=batches, streaming=True)
    try:
        for run in stream:
            per_runner = {name: iterations[0] for name, iterations in run.items()}
            offset += _accumulate(per_runner, reference.name, results, labels, offset, classifier_output)
    finally:
        stream.close()  # deactivates the runners even when a batch fails
    return list(results.values())


def _accumulate(per_runner: dict, reference: str, results: dict[str, Comparison], labels: np.ndarray | None, offset: int, classifier_output: str | None) -> int:
    ref = per_runner[reference]
    batch = len(next(iter(ref.values())))
    truth = labels[offset : offset + batch] if labels is not None else None
    ref_top1 = np.argmax(ref[classifier_output], axis=-1) if classifier_output else None
    for name, comparison in results.items():
        out = per_runner[name]
        if set(out) != set(ref):
            raise PipelineError(
                f"'{name}' has outputs {sorted(out)} but '{reference}' has {sorted(ref)}",
                "compare models with the same output names",
            )
        for key, ref_value in ref.items():
            comparison.outputs.setdefault(key, OutputStats()).add(np.asarray(ref_value), np.asarray(out[key]))
        comparison.samples += batch
        if ref_top1 is not None:
            top1 = np.argmax(out[classifier_output], axis=-1)
            comparison._agree += int((top1 == ref_top1).sum())
            comparison.disagree = comparison.samples - comparison._agree
            comparison.top1_agreement = comparison._agree / comparison.samples
            if truth is not None:
                right, ref_right = top1 == truth, ref_top1 == truth
                comparison.worse += int((ref_right & ~right).sum())
                comparison.better += int((~ref_right & right).sum())
                comparison._correct += int(right.sum())
                comparison._ref_correct += int(ref_right.sum())
                comparison.accuracy = comparison._correct / comparison.samples
                comparison.reference_accuracy = comparison._ref_correct / comparison.samples
    return batch
