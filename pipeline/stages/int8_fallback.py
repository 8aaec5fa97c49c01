"""Accuracy-aware INT8: quantize, gate, and where the gate does not pass, keep the costliest nodes in float until it does.

The search Polygraphy's ``debug precision`` and Intel Neural Compressor's accuracy-driven tuning automate, wired to
this project's gate (every output judged by its kind, with confidence bounds: :mod:`pipeline.accuracy.judging`):

1. the model is calibrated once (:class:`pipeline.stages.int8.Calibrated`) and quantized;
2. it is judged against FP32 on the evaluation data exactly as the accuracy stage will judge it;
3. if it does not pass (a failed or an undecided figure), every quantized node is given a cost: how much closer to
   FP32 the outputs that did not pass come with that node alone left float (:mod:`pipeline.stages.node_costs`),
   measured on *calibration* samples, so the evaluation data does not rank the nodes (it does decide how many are
   kept: each set tried is judged on it, as the gate judges, and the first that passes is taken);
4. the 1, 2, 4, … costliest nodes are kept in float, each set quantized and judged, until one passes or the bound
   is reached (``max_share`` of the quantized nodes); between the last set that failed and the first that passed,
   a bisection finds the fewest nodes that pass, since every node kept float costs speed.

Ties in cost are broken by node name and every step is deterministic, so the same model, data and settings choose
the same nodes; the stage cache keys the result on all of them. What was kept, what each node cost and every set
tried are written to a JSON record beside the model, shown in the build's report.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.accuracy.evaldata import EvalData
from pipeline.accuracy.gates import Gates
from pipeline.accuracy.judging import VariantResult
from pipeline.accuracy.outputkinds import kinds_from_json
from pipeline.backend.budget import DEFAULT_MAX_MEMORY_GIB
from pipeline.core.atomic import write_text_atomic
from pipeline.core.onnx_files import move_onnx
from pipeline.data.artifacts import Artifact
from pipeline.stages.accuracy import judge_variant
from pipeline.stages.calibration import CalibrationData
from pipeline.stages.gather_tables import DEFAULT_TABLE_MIN_MIB
from pipeline.stages.int8 import TENSORRT_RECIPE, Calibrated, log_kept
from pipeline.stages.int8_calibrate import QuantRecipe, calibration_batch
from pipeline.stages.int8_cpu import CPU_RECIPE, check_qdq_uint8_activations
from pipeline.stages.node_costs import NodeCost, node_costs_from_models
from pipeline.stages.qdq_placement import WEIGHTED

log = logging.getLogger(__name__)

RECIPES: dict[str, QuantRecipe] = {"int8": TENSORRT_RECIPE, "int8cpu": CPU_RECIPE}
# The nodes each recipe can keep float: TensorRT's graph quantizes only weighted layers (its Adds, pooling and Concats
# follow them: pipeline.stages.qdq_placement); the CPU graph quantizes these ops' inputs themselves.
CANDIDATE_OP_TYPES = {"int8": WEIGHTED, "int8cpu": ("Conv", "MatMul", "Gemm", "Add", "Concat", "AveragePool", "GlobalAveragePool", "MaxPool")}
RANKING_SAMPLES = 64
FALLBACK_FLAG = "--no-int8-fallback"


@dataclass(frozen=True)
class FallbackSettings:
    """How far the accuracy-aware fallback may go (``--no-int8-fallback``, ``--int8-fallback-max-share``)."""

    enabled: bool = True
    max_share: float = 0.5  # of the quantized nodes, at most this share kept in float (and at least MIN_BOUND nodes)


@dataclass(frozen=True)
class Tried:
    """One set of nodes kept in float, and its gate's verdict."""

    kept: int
    passed: bool
    failures: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"kept": self.kept, "passed": self.passed, "failures": list(self.failures)}


def gated_int8_onnx_from_onnx(
    src: Path,
    dst: Path,
    calibration: CalibrationData,
    data: EvalData,
    record: Path,
    *,
    recipe: str,
    gates: Gates,
    kinds: Sequence[Mapping[str, Any]],
    batch_size: int,
    fallback: FallbackSettings = FallbackSettings(),
    method: str = "percentile",
    percentile: float = 99.999,
    max_memory_gib: float = DEFAULT_MAX_MEMORY_GIB,
    keep_nodes: Sequence[str] = (),
    table_min_mib: float = DEFAULT_TABLE_MIN_MIB,
) -> Path:
    """Write the ``recipe`` ("int8": TensorRT's Q/DQ graph; "int8cpu": ONNX Runtime's CPU form) INT8 variant of ``src``
    to ``dst``, with as few nodes kept in float as its gate needs (see the module docstring), and the search's JSON
    ``record``. ``keep_nodes`` are kept float whatever the search finds. Where no set within the bound passes, ``dst``
    is the plain quantized model and the record says what was tried: the accuracy stage then fails it as it is.
    Gather tables of at least ``table_min_mib`` are quantized weights-only, per row (see gather_tables)."""
    quant = RECIPES[recipe]
    by_name = kinds_from_json(kinds)

    def judge(path: Path) -> VariantResult:
        return judge_variant(src, Artifact(recipe, "onnx", path), data, gates=gates, kinds=by_name, batch_size=batch_size)

    with Calibrated(src, dst, calibration, quant, method=method, percentile=percentile, batch_size=None, max_memory_gib=max_memory_gib,
                    table_min_mib=table_min_mib) as calibrated:
        base = calibrated.checked_keep_nodes(keep_nodes)
        first = calibrated.quantize(base)
        verdict = judge(first)
        summary: dict[str, Any] = {"variant": recipe, "needed": not verdict.passed, "enabled": fallback.enabled, "passed": verdict.passed,
                                   "first": Tried(0, verdict.passed, tuple(verdict.failures + verdict.undecided)).as_dict(), "kept": [], "tried": []}
        chosen = first
        if not verdict.passed and fallback.enabled:
            batch, drop_last = calibration_batch(calibrated.signature, RANKING_SAMPLES, calibration.num_samples)
            feed = next(calibration.batches(batch, drop_last=drop_last))
            failing = sorted({row["output"] for row in verdict.rows if row["verdict"] in ("fail", "undecided")})
            costs = node_costs_from_models(src, first, feed, CANDIDATE_OP_TYPES[recipe], outputs=failing)
            ranked = ranked_nodes(costs, exclude=base)
            quantized = len([c for c in costs if c.node not in base])  # every quantized node the search could keep float
            search = FallbackSearch(lambda nodes: calibrated.quantize(base | {e.node for e in nodes}), judge, ranked,
                                    bound=min(len(ranked), max_kept(quantized, fallback.max_share)))
            found = search.run()
            summary.update(search.summary(quantized, fallback.max_share, feed), ranked=[c.as_dict() for c in ranked[:16]], outputs=failing)
            if found is not None:
                chosen = found
        summary["judged_on"] = f"{data.num_samples} samples of {data.source}"  # the nodes are ranked on calibration samples
        move_onnx(chosen, dst)
    write_text_atomic(Path(record), json.dumps(summary, indent=2) + "\n")
    log_kept(quant.label, base)
    if recipe == "int8cpu":
        check_qdq_uint8_activations(dst)
    return dst


MIN_BOUND = 2  # a small model's share rounds to nothing: two of its nodes may always stay float


def max_kept(candidates: int, share: float) -> int:
    """How many nodes the search may keep in float: ``share`` of the candidates, at least :data:`MIN_BOUND` where there are
    as many, and never every one (a model with all its quantized nodes in float is not an INT8 variant)."""
    return max(0, min(candidates - 1, max(MIN_BOUND, math.floor(candidates * share))))


def ranked_nodes(costs: Sequence[NodeCost], exclude: set[str] = frozenset()) -> list[NodeCost]:  # type: ignore[assignment]
    """The nodes whose quantization costs the outputs (or, unmeasured, adds error), costliest first, ties by name."""
    return sorted((c for c in costs if (c.cost > 0 or c.jump > 0) and c.node not in exclude), key=lambda c: (-c.cost, -c.jump, c.node))


class FallbackSearch:
    """Keep the 1, 2, 4, … first nodes of ``ranked`` in float (``quantize``) until ``judge`` passes one set or ``bound``
    is reached, then bisect between the last failing and the first passing count for the fewest that pass."""

    def __init__(self, quantize: Callable[[list[NodeCost]], Path], judge: Callable[[Path], VariantResult], ranked: list[NodeCost],
                 bound: int) -> None:
        self.quantize, self.judge, self.ranked, self.bound = quantize, judge, ranked, bound
        self.tried: list[Tried] = []
        self.passing: dict[int, Path] = {}

    def _try(self, count: int) -> bool:
        path = self.quantize(self.ranked[:count])
        verdict = self.judge(path)
        self.tried.append(Tried(count, verdict.passed, tuple(verdict.failures + verdict.undecided)))
        log.info("INT8 fallback: %d node(s) kept in float: %s", count, "passes" if verdict.passed else "; ".join(verdict.failures + verdict.undecided))
        if verdict.passed:
            self.passing[count] = path
        return verdict.passed

    def run(self) -> Path | None:
        """The model of the fewest nodes found that pass, or None when no count within the bound passes."""
        low, count = 0, min(1, self.bound)
        while True:
            if count == 0:
                return None
            if self._try(count):
                break
            if count >= self.bound:
                return None
            low, count = count, min(count * 2, self.bound)
        high = count
        while high - low > 1:  # low fails (or is 0, the plain model, which failed), high passes
            middle = (low + high) // 2
            if self._try(middle):
                high = middle
            else:
                low = middle
        self.kept = self.ranked[:high]
        return self.passing[high]

    def summary(self, candidates: int, share: float, feed: Mapping[str, Any]) -> dict[str, Any]:
        """The record's fields: the bound, every set tried, and the nodes kept with their costs."""
        kept = getattr(self, "kept", [])
        samples = len(next(iter(feed.values()))) if feed else 0
        return {"passed": bool(kept), "candidates": candidates, "bound": self.bound, "max_share": share,
                "ranked_on": f"{samples} calibration samples", "tried": [t.as_dict() for t in self.tried],
                "kept": [c.as_dict() for c in kept]}


def describe_fallback(summary: Mapping[str, Any]) -> str:
    """One line: what the fallback did for a variant (from its record)."""
    variant = summary.get("variant", "int8")
    if not summary.get("needed"):
        return f"{variant}: gate passed fully quantized"
    if not summary.get("enabled"):
        return f"{variant}: gate did not pass and the fallback is off ({FALLBACK_FLAG})"
    kept = summary.get("kept") or []
    samples = f" (nodes ranked on {summary['ranked_on']}, each set judged on {summary['judged_on']})" if summary.get("ranked_on") and summary.get("judged_on") else ""
    if not kept and not summary.get("bound") and summary.get("candidates", 0) > 1:
        return (f"{variant}: the gate did not pass, and none of its {summary.get('candidates', 0)} quantized nodes, kept in float alone, "
                "brought the outputs that failed closer to FP32: nothing to try")
    if not kept and not summary.get("bound"):
        return (f"{variant}: the gate did not pass, and with {summary.get('candidates', 0)} quantized node(s) none can be kept in float "
                "without leaving no INT8 at all")
    if not kept:
        tried = ", ".join(str(t["kept"]) for t in summary.get("tried", []))
        return (f"{variant}: no set of up to {summary.get('bound', 0)} of {summary.get('candidates', 0)} quantized nodes kept in float "
                f"passes the gate (sets of {tried} tried){samples}")
    shown = ", ".join(f"{k['node']} ({k['cost']:.3f})" for k in kept[:8]) + (f" and {len(kept) - 8} more" if len(kept) > 8 else "")
    return f"{variant}: gate passes with {len(kept)} of {summary.get('candidates', 0)} quantized nodes kept in float: {shown}{samples}"
