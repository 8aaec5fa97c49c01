"""What each kind of output is judged on: streaming statistics of a variant against FP32, per output.

One :class:`TaskStats` per (candidate, output) is fed every evaluation batch (the FP32 output, the
candidate's output and, where the evaluation data has them, the labels of that output) and at the
end yields :class:`Figure` values: the measured figure with its confidence bounds. How a figure is
judged against its limit is :func:`pipeline.accuracy.judging.judge_figure`.

The statistical unit is the sample: per-position and per-label rates are averaged per sample first,
and their bounds come from the spread of those per-sample values (positions of one image are not
independent draws). One-sample decisions (top-1, a binary decision) use the paired score bounds of
pipeline.accuracy.bounds, as the top-1 gate always has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from pipeline.accuracy.bounds import disagreement, mean_bounds, paired_drop
from pipeline.accuracy.outputkinds import OutputKind

NEIGHBOUR_SAMPLES = 4096  # embeddings kept for the nearest-neighbour check (an n² similarity matrix)
BOOTSTRAP_DRAWS = 400


@dataclass(frozen=True)
class Figure:
    """One measured figure of one output: its value, confidence bounds, and the direction that is worse."""

    metric: str  # e.g. "top-1 disagreement", "RMS change / FP32 std"
    value: float
    low: float
    high: float
    unit: str  # "points" (percentage points) or "" (a ratio or a cosine)
    worse: str  # "higher" (a drop, an error) or "lower" (an agreement, a cosine)
    limit_key: str  # which Tolerance field limits it
    gated: bool = True  # False: reported beside the gated figure of the same output
    decisions: bool = False  # one decision per sample (top-1, binary): a perfect result needs bounds.min_samples samples


def _finite(array: np.ndarray) -> np.ndarray:
    # Non-finite values are counted and failed by OutputStats; here they must not poison the statistics.
    return np.nan_to_num(array.astype(np.float64), nan=0.0, posinf=1e30, neginf=-1e30)


def _per_sample(array: np.ndarray) -> np.ndarray:
    return array.reshape(len(array), -1)


def _row_mean(per_sample: np.ndarray) -> np.ndarray:
    """Each sample's mean; 0 for a sample with no elements (a dynamic axis of length 0 cannot differ)."""
    return per_sample.mean(axis=1) if per_sample.shape[1] else np.zeros(len(per_sample))


class TaskStats:
    """Base: accumulate batches, then :meth:`figures`."""

    def __init__(self, kind: OutputKind, threshold: float) -> None:
        self.kind = kind
        self.threshold = threshold
        self.samples = 0

    def add(self, ref: np.ndarray, out: np.ndarray, target: np.ndarray | None) -> None:
        """One batch of FP32 outputs, candidate outputs and (optional) labels."""
        raise NotImplementedError

    def figures(self, confidence: float) -> list[Figure]:
        """The judged figures (first) and informative ones."""
        raise NotImplementedError

    def summary(self) -> dict[str, float | None]:
        """Accuracy-style numbers for tables: the candidate's and FP32's task metric with labels, agreement without."""
        return {}


class DecisionStats(TaskStats):
    """``classes`` (top-1) and ``binary`` (a decision at a threshold): one decision per sample."""

    def __init__(self, kind: OutputKind, threshold: float) -> None:
        super().__init__(kind, threshold)
        self.disagree = self.worse = self.better = self.correct = self.ref_correct = 0
        self.labeled = False

    def decide(self, scores: np.ndarray) -> np.ndarray:
        scores = _finite(scores)
        if self.kind.kind == "classes":
            return scores.reshape(len(scores), -1).argmax(-1)
        cut = math.log(self.threshold / (1 - self.threshold)) if self.kind.logits else self.threshold
        return (scores.reshape(len(scores)) > cut).astype(np.int64)

    def add(self, ref: np.ndarray, out: np.ndarray, target: np.ndarray | None) -> None:
        a, b = self.decide(ref), self.decide(out)
        self.samples += len(a)
        self.disagree += int((a != b).sum())
        if target is not None:
            self.labeled = True
            truth = target.reshape(len(target)).astype(np.int64)
            ref_right, right = a == truth, b == truth
            self.worse += int((ref_right & ~right).sum())
            self.better += int((~ref_right & right).sum())
            self.correct += int(right.sum())
            self.ref_correct += int(ref_right.sum())

    def figures(self, confidence: float) -> list[Figure]:
        what = "top-1" if self.kind.kind == "classes" else "decision"
        if self.labeled:
            e = paired_drop(self.worse, self.better, self.samples, confidence)
            return [Figure(f"accuracy drop ({what})", e.drop, e.low, e.high, "points", "higher", "max_drop_points", decisions=True)]
        e = disagreement(self.disagree, self.samples, confidence)
        return [Figure(f"{what} disagreement", e.drop, e.low, e.high, "points", "higher", "max_drop_points", decisions=True)]

    def summary(self) -> dict[str, float | None]:
        n = max(self.samples, 1)
        return {"accuracy": self.correct / n if self.labeled else None, "reference_accuracy": self.ref_correct / n if self.labeled else None,
                "agreement": 1 - self.disagree / n}


class MultilabelStats(TaskStats):
    """``multilabel``: K decisions per sample (or per position); the per-sample flip rate."""

    def __init__(self, kind: OutputKind, threshold: float) -> None:
        super().__init__(kind, threshold)
        self.flips: list[np.ndarray] = []
        self.drops: list[np.ndarray] = []
        self.acc: list[np.ndarray] = []
        self.ref_acc: list[np.ndarray] = []

    def decide(self, scores: np.ndarray) -> np.ndarray:
        cut = math.log(self.threshold / (1 - self.threshold)) if self.kind.logits else self.threshold
        return _per_sample(_finite(scores)) > cut

    def add(self, ref: np.ndarray, out: np.ndarray, target: np.ndarray | None) -> None:
        a, b = self.decide(ref), self.decide(out)
        self.samples += len(a)
        self.flips.append((a != b).mean(axis=1))
        if target is not None:
            truth = _per_sample(target) > 0.5
            ref_acc, acc = (a == truth).mean(axis=1), (b == truth).mean(axis=1)
            self.acc.append(acc)
            self.ref_acc.append(ref_acc)
            self.drops.append(ref_acc - acc)

    def figures(self, confidence: float) -> list[Figure]:
        if self.drops:
            mean, low, high = mean_bounds(np.concatenate(self.drops), confidence)
            return [Figure("label accuracy drop", mean * 100, low * 100, high * 100, "points", "higher", "max_drop_points")]
        mean, low, high = mean_bounds(np.concatenate(self.flips), confidence)
        return [Figure("label decisions flipped", mean * 100, low * 100, high * 100, "points", "higher", "max_drop_points")]

    def summary(self) -> dict[str, float | None]:
        return {"accuracy": float(np.concatenate(self.acc).mean()) if self.acc else None,
                "reference_accuracy": float(np.concatenate(self.ref_acc).mean()) if self.ref_acc else None,
                "agreement": 1 - float(np.concatenate(self.flips).mean()) if self.flips else None}


class RegressionStats(TaskStats):
    """``regression``: the RMS change relative to the FP32 output's spread; with targets, the R² drop."""

    def __init__(self, kind: OutputKind, threshold: float) -> None:
        super().__init__(kind, threshold)
        self.sq_change: list[np.ndarray] = []  # per sample: mean squared change over its elements
        self.sq_gain: list[np.ndarray] = []  # per sample: mean (e_variant² − e_fp32²) against the target
        self.ref_moments = np.zeros(3)  # count, mean, sum of squared deviations of the FP32 output's elements
        self.target_moments = np.zeros(3)
        self.sq_err_ref = self.sq_err_out = 0.0

    def add(self, ref: np.ndarray, out: np.ndarray, target: np.ndarray | None) -> None:
        r, o = _per_sample(_finite(ref)), _per_sample(_finite(out))
        self.samples += len(r)
        self.sq_change.append(_row_mean((o - r) ** 2))
        self.ref_moments = self._merged(self.ref_moments, r)
        if target is not None:
            t = _per_sample(target.astype(np.float64))  # same elements per sample: checked when the data was read
            e_ref, e_out = _row_mean((r - t) ** 2), _row_mean((o - t) ** 2)
            self.sq_gain.append(e_out - e_ref)
            self.sq_err_ref += float(e_ref.sum())
            self.sq_err_out += float(e_out.sum())
            self.target_moments = self._merged(self.target_moments, t)

    @staticmethod
    def _merged(moments: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``moments`` with one batch's ``values`` added (Chan et al.'s merge of counts, means and squared deviations).
        Sum of squares − n·mean² cancels to rounding noise for an output far from zero, and is not 0 for a constant one."""
        if values.size == 0:  # an output with no elements in this batch (a dynamic axis of length 0)
            return moments
        count, mean, deviations = moments
        batch_mean = values.flat[0] + (values - values.flat[0]).mean()  # exactly the value of a constant batch
        delta, total = batch_mean - mean, count + values.size
        deviations += ((values - batch_mean) ** 2).sum() + delta**2 * count * values.size / total
        return np.array([total, mean + delta * (values.size / total), deviations])

    @staticmethod
    def _variance(moments: np.ndarray) -> float:
        count, _, deviations = moments
        return float(deviations / max(count, 1))  # no elements yet (every batch empty): 0

    def figures(self, confidence: float) -> list[Figure]:
        spread = math.sqrt(self._variance(self.ref_moments))
        mean, low, high = mean_bounds(np.concatenate(self.sq_change), confidence)
        scale = spread if spread > 0 else 1.0
        change = Figure("RMS change / FP32 std", math.sqrt(max(mean, 0)) / scale, math.sqrt(max(low, 0)) / scale, math.sqrt(max(high, 0)) / scale,
                        "", "higher", "max_rel_error")  # fmt: skip
        if not self.sq_gain:
            return [change]
        var_t = self._variance(self.target_moments) or 1.0
        mean, low, high = mean_bounds(np.concatenate(self.sq_gain), confidence)
        r2 = Figure("R² drop", mean / var_t * 100, low / var_t * 100, high / var_t * 100, "points", "higher", "max_drop_points")
        return [r2, replace(change, gated=False)]  # with targets the task metric is judged, as top-1 accuracy is

    def summary(self) -> dict[str, float | None]:
        if not self.sq_gain:
            return {}
        var_t, n = self._variance(self.target_moments) or 1.0, max(self.samples, 1)
        return {"accuracy": 1 - self.sq_err_out / n / var_t, "reference_accuracy": 1 - self.sq_err_ref / n / var_t}  # R²


class SegmentationStats(TaskStats):
    """``segmentation``: per-position top-1 agreement; with per-position labels, the mean-IoU drop."""

    def __init__(self, kind: OutputKind, threshold: float) -> None:
        super().__init__(kind, threshold)
        self.flips: list[np.ndarray] = []
        self.inter: list[np.ndarray] = []  # per sample and class: (fp32, candidate) intersections
        self.union: list[np.ndarray] = []

    def add(self, ref: np.ndarray, out: np.ndarray, target: np.ndarray | None) -> None:
        a, b = _finite(ref).argmax(-1), _finite(out).argmax(-1)
        self.samples += len(a)
        self.flips.append(_per_sample(a != b).mean(axis=1))
        if target is not None:
            k = ref.shape[-1]
            truth = _per_sample(target.astype(np.int64))
            inter, union = np.zeros((len(a), k, 2)), np.zeros((len(a), k, 2))
            for j, pred in enumerate((_per_sample(a), _per_sample(b))):
                for c in range(k):
                    p, t = pred == c, truth == c
                    inter[:, c, j] = (p & t).sum(axis=1)
                    union[:, c, j] = (p | t).sum(axis=1)
            self.inter.append(inter)
            self.union.append(union)

    @staticmethod
    def _miou(inter: np.ndarray, union: np.ndarray) -> np.ndarray:
        """mIoU over classes present (union > 0), for (…, K) sums."""
        present = union > 0
        iou = np.where(present, inter / np.where(present, union, 1), 0.0)
        return iou.sum(axis=-1) / np.maximum(present.sum(axis=-1), 1)

    def figures(self, confidence: float) -> list[Figure]:
        if self.inter:
            inter, union = np.concatenate(self.inter), np.concatenate(self.union)
            miou = self._miou(inter.sum(axis=0).T, union.sum(axis=0).T)  # (2,) fp32, candidate
            rng = np.random.default_rng(0)
            draws = rng.integers(0, len(inter), (BOOTSTRAP_DRAWS, len(inter)))
            # paired bootstrap over samples: the same resample for FP32 and the candidate
            boot = np.array([self._miou(inter[d].sum(axis=0).T, union[d].sum(axis=0).T) for d in draws])
            drops = (boot[:, 0] - boot[:, 1]) * 100
            low, high = np.quantile(drops, [1 - confidence, confidence])
            return [Figure("mIoU drop", (miou[0] - miou[1]) * 100, float(low), float(high), "points", "higher", "max_drop_points")]
        mean, low, high = mean_bounds(np.concatenate(self.flips), confidence)
        return [Figure("positions changing class", mean * 100, low * 100, high * 100, "points", "higher", "max_drop_points")]

    def summary(self) -> dict[str, float | None]:
        agreement = 1 - float(np.concatenate(self.flips).mean()) if self.flips else None
        if not self.inter:
            return {"agreement": agreement}
        inter, union = np.concatenate(self.inter).sum(axis=0).T, np.concatenate(self.union).sum(axis=0).T
        miou = self._miou(inter, union)
        return {"accuracy": float(miou[1]), "reference_accuracy": float(miou[0]), "agreement": agreement}  # mIoU


class EmbeddingStats(TaskStats):
    """``embedding``: per-sample cosine to FP32 (mean and 5th percentile) and nearest-neighbour agreement."""

    def __init__(self, kind: OutputKind, threshold: float) -> None:
        super().__init__(kind, threshold)
        self.cosines: list[np.ndarray] = []
        self.ref_vectors: list[np.ndarray] = []
        self.vectors: list[np.ndarray] = []
        self.kept = 0

    def add(self, ref: np.ndarray, out: np.ndarray, target: np.ndarray | None) -> None:
        r, o = _per_sample(_finite(ref)), _per_sample(_finite(out))
        self.samples += len(r)
        rn, on = _unit(r), _unit(o)
        self.cosines.append((rn * on).sum(axis=1))
        room = NEIGHBOUR_SAMPLES - self.kept
        if room > 0:
            self.ref_vectors.append(rn[:room])
            self.vectors.append(on[:room])
            self.kept += min(room, len(rn))

    def figures(self, confidence: float) -> list[Figure]:
        cos = np.concatenate(self.cosines)
        mean, low, high = mean_bounds(cos, confidence)
        figures = [Figure("mean cosine to FP32", mean, low, high, "", "lower", "min_cosine"),
                   Figure("5th-percentile cosine", float(np.percentile(cos, 5)), float(np.percentile(cos, 5)), float(np.percentile(cos, 5)),
                          "", "lower", "min_cosine_low")]  # fmt: skip
        if self.kept >= 3:
            ref, out = np.concatenate(self.ref_vectors), np.concatenate(self.vectors)
            disagree = int((_nearest(ref) != _nearest(out)).sum())
            e = disagreement(disagree, len(ref), confidence)
            figures.append(Figure("nearest-neighbour agreement", 1 - e.drop / 100, 1 - e.high / 100, 1 - e.low / 100, "", "lower",
                                  "min_neighbour_agreement"))  # fmt: skip
        return figures

    def summary(self) -> dict[str, float | None]:
        return {"agreement": float(np.concatenate(self.cosines).mean()) if self.cosines else None}


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


def _nearest(unit_vectors: np.ndarray) -> np.ndarray:
    similarity = unit_vectors @ unit_vectors.T
    np.fill_diagonal(similarity, -np.inf)
    return similarity.argmax(axis=1)


_BY_KIND: dict[str, type[TaskStats]] = {
    "classes": DecisionStats, "binary": DecisionStats, "multilabel": MultilabelStats,
    "regression": RegressionStats, "segmentation": SegmentationStats, "embedding": EmbeddingStats,
}


def task_stats_for(kind: OutputKind, threshold: float) -> TaskStats:
    """The accumulator that judges an output of ``kind``."""
    return _BY_KIND[kind.kind](kind, threshold)
