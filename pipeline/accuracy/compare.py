"""Compare models output by output on real data, streaming batch by batch through Polygraphy.

One pass feeds every batch to a reference runner and the candidates (Polygraphy's
``Comparator.run`` in streaming mode, so memory stays flat however large the data), and
accumulates per output: element-wise error statistics with a count of non-finite values
(:class:`OutputStats`) and, where the output's kind is known, what that kind is judged on
(:mod:`pipeline.accuracy.taskstats`), with the output's labels where the data has them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from polygraphy.backend.base import BaseRunner

from pipeline.accuracy.outputkinds import OutputKind
from pipeline.accuracy.taskstats import TaskStats, task_stats_for
from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)

# Where the reference computes in a narrower float (a mixed-precision Keras model), its own result is only as close to
# the true value as that format's spacing: (mantissa bits, smallest normal exponent) of each.
FLOAT_FORMATS = {"float16": (10, -14), "bfloat16": (7, -126)}


def format_spacing(fmt: str, magnitude: np.ndarray) -> np.ndarray:
    """The spacing of ``fmt`` (a key of :data:`FLOAT_FORMATS`) between representable values at each ``magnitude``
    (one ULP there; the subnormal spacing below the smallest normal)."""
    bits, min_exponent = FLOAT_FORMATS[fmt]
    exponent = np.floor(np.log2(np.maximum(np.abs(magnitude), 2.0**min_exponent)))
    return np.exp2(exponent - bits)


@dataclass
class OutputStats:
    """Error of one output against the reference, over all samples. Statistics cover the elements
    finite in both; ``nonfinite`` counts elements where the two disagree on being finite (a NaN or
    ±Inf the reference does not have in the same place)."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    mean_abs: float = 0.0
    elements: int = 0
    mean_cosine: float = 1.0  # per sample, flattened
    min_cosine: float = 1.0
    rel_l2: float = 0.0  # ||out − ref|| / ||ref|| over all samples
    samples: int = 0
    nonfinite: int = 0
    nonfinite_samples: int = 0
    _sq_diff: float = 0.0
    _sq_ref: float = 0.0
    tolerance: tuple[float, float] | None = None  # (atol, rtol): count the values past atol + rtol·|reference|
    beyond: int = 0  # values past the tolerance (with one)
    # with a reference computing in float16/bfloat16: also ``ulps`` of that format's spacing at each sample's largest
    # |value| (its errors come from intermediate values of that size, whatever the size of the value itself)
    reference_format: str = "float32"
    ulps: float = 0.0

    def add(self, ref: np.ndarray, out: np.ndarray) -> None:
        ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
        if ref64.shape != out64.shape:
            raise PipelineError(f"output shapes differ: {out64.shape} against the reference's {ref64.shape}", "compare models with the same outputs")
        finite_ref, finite_out = np.isfinite(ref64), np.isfinite(out64)
        same_special = ~finite_ref & ~finite_out & ((ref64 == out64) | (np.isnan(ref64) & np.isnan(out64)))
        mismatch = (finite_ref != finite_out) | (~finite_ref & ~finite_out & ~same_special)
        if mismatch.any():
            self.nonfinite += int(mismatch.sum())
            self.nonfinite_samples += int(mismatch.reshape(len(mismatch), -1).any(axis=1).sum()) if mismatch.ndim else 1
        both = finite_ref & finite_out
        ref64, out64 = np.where(both, ref64, 0.0), np.where(both, out64, 0.0)
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
        if self.tolerance is not None and n:  # element by element, as numpy.allclose: each value's own magnitude
            atol, rtol = self.tolerance
            bound = atol + rtol * np.abs(ref64)
            if self.reference_format in FLOAT_FORMATS and self.ulps and ref64.ndim >= 1 and len(ref64):
                row_scale = np.abs(ref64).reshape(len(ref64), -1).max(axis=1).reshape((-1,) + (1,) * (ref64.ndim - 1))
                bound = bound + self.ulps * format_spacing(self.reference_format, row_scale)
            self.beyond += int((diff > bound).sum())

    def as_dict(self) -> dict:
        """JSON form (running sums left out; the tolerance and its count only where one was given)."""
        unasked = {"tolerance", "beyond", "reference_format", "ulps"} if self.tolerance is None else set()
        return {k: v for k, v in asdict(self).items() if not k.startswith("_") and k not in unasked}


@dataclass
class Comparison:
    """How one candidate compares with the reference, output by output."""

    runner: str
    samples: int = 0
    outputs: dict[str, OutputStats] = field(default_factory=dict)
    tasks: dict[str, TaskStats] = field(default_factory=dict)
    tolerance: tuple[float, float] | None = None  # (atol, rtol) each output's values are counted against
    reference_format: str = "float32"  # with ``ulps``: see OutputStats
    ulps: float = 0.0

    def summary(self, output: str) -> dict[str, float | None]:
        """The task metric of ``output`` (accuracy, R², mIoU) for the candidate and FP32, and agreement."""
        task = self.tasks.get(output)
        return task.summary() if task else {}

    def add(self, ref: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], target: Mapping[str, np.ndarray]) -> None:
        """One batch: every output of the reference and of the candidate, and the labels of the outputs that have them."""
        for key, ref_value in ref.items():
            ref_array, out_array = np.asarray(ref_value), np.asarray(out[key])
            stats = self.outputs.setdefault(key, OutputStats(tolerance=self.tolerance, reference_format=self.reference_format, ulps=self.ulps))
            stats.add(ref_array, out_array)
            if key in self.tasks:
                self.tasks[key].add(ref_array, out_array, target.get(key))
        self.samples += len(next(iter(ref.values())))

    def as_dict(self) -> dict:
        """JSON form: per output, its error statistics and task summary."""
        return {"runner": self.runner, "samples": self.samples,
                "outputs": {k: {**v.as_dict(), **self.summary(k)} for k, v in self.outputs.items()}}


def compare_runners(
    reference: BaseRunner,
    candidates: Sequence[BaseRunner],
    batches: Iterable[dict[str, np.ndarray]],
    *,
    kinds: Mapping[str, OutputKind] | None = None,
    targets: Iterator[Mapping[str, np.ndarray]] | None = None,
    threshold: float = 0.5,
    tolerance: tuple[float, float] | None = None,
    reference_format: str = "float32",
    ulps: float = 0.0,
) -> list[Comparison]:
    """Run ``reference`` and ``candidates`` on every batch; return one Comparison per candidate.

    ``kinds`` (output → kind) adds each output's task statistics; ``targets`` yields, batch by batch in
    step with ``batches``, the labels of the outputs that have them; ``threshold`` is the decision
    threshold of binary and multi-label outputs; ``tolerance`` ``(atol, rtol)`` counts, per output, the values
    farther from the reference's than ``atol + rtol·|reference|`` (:attr:`OutputStats.beyond`), plus, where the
    reference computes in ``reference_format`` (float16, bfloat16), ``ulps`` of its spacing at each sample's scale.
    """
    from polygraphy.comparator import Comparator

    results = {c.name: new_comparison(c.name, kinds, threshold) for c in candidates}
    for comparison in results.values():
        comparison.tolerance, comparison.reference_format, comparison.ulps = tolerance, reference_format, ulps
    stream = Comparator.run([reference, *candidates], data_loader=batches, streaming=True)
    try:
        for run in stream:
            per_runner = {name: iterations[0] for name, iterations in run.items()}
            target = next(targets) if targets is not None else {}
            ref = per_runner[reference.name]
            for name, comparison in results.items():
                if set(per_runner[name]) != set(ref):
                    raise PipelineError(f"'{name}' has outputs {sorted(per_runner[name])} but '{reference.name}' has {sorted(ref)}",
                                        "compare models with the same output names")
                comparison.add(ref, per_runner[name], target)
    finally:
        stream.close()  # deactivates the runners even when a batch fails
    return list(results.values())


def new_comparison(name: str, kinds: Mapping[str, OutputKind] | None, threshold: float) -> Comparison:
    """An empty comparison that judges each output of ``kinds`` by its kind (see :meth:`Comparison.add`)."""
    return Comparison(name, tasks={output: task_stats_for(kind, threshold) for output, kind in (kinds or {}).items()})
