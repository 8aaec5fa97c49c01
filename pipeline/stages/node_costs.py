"""What each quantized node costs the model's outputs: how much closer to FP32 the outputs come when that node alone
reads float inputs (its DequantizeLinear(QuantizeLinear(x)) inputs bypassed), the rest of the Q/DQ graph as it is.

A node's own jump in error (:mod:`pipeline.stages.layer_errors`) is a poor guide on its own: a first layer that
rounds a feature of a huge range to nothing adds only a modest relative error to its output, which the layers after
it turn into a wrong class, while a head whose logits are near zero shows a large relative jump that costs little.
Leaving one node out of quantization at a time and measuring the outputs ranks them by what they do to the result.
Measured with exact Q/DQ semantics (ONNX Runtime, graph optimizations off) on calibration samples; the first
:data:`MAX_EVALUATED` nodes by jump are measured, any others follow in jump order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.core.onnx_files import graph_proto
from pipeline.stages.layer_errors import layer_errors_from_models
from pipeline.stages.qdq_placement import WEIGHTED

log = logging.getLogger(__name__)

MAX_EVALUATED = 64


@dataclass(frozen=True)
class NodeCost:
    """One quantized node: the output error it causes (``cost``: the model outputs' relative L2 error vs FP32 with the
    graph as quantized, less that error with this node's inputs float) and its own jump in error."""

    node: str
    op_type: str
    cost: float
    jump: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def node_costs_from_models(fp32: Path, quantized: Path, feed: Mapping[str, np.ndarray], op_types: Sequence[str] = WEIGHTED,
                           outputs: Sequence[str] = ()) -> list[NodeCost]:
    """Every node of ``op_types`` of ``quantized`` that reads a quantized tensor, costliest first (ties by name). The cost
    is measured on ``outputs`` (the ones whose gate did not pass; default: every output), each output's error taken
    relative to its FP32 spread (as a regression gate judges it), summed."""
    from pipeline.backend.onnxrt import session_from_onnx

    jumps = {e.node: e for e in layer_errors_from_models(fp32, quantized, feed, op_types)}
    reference = session_from_onnx(fp32)
    outputs = [o.name for o in reference.get_outputs() if not outputs or o.name in outputs] or [o.name for o in reference.get_outputs()]
    expected = _run(reference, outputs, feed)
    model = graph_proto(quantized)  # the graph; ONNX Runtime reads the weights from their data file, if any
    folder = Path(quantized).parent
    producers = {o: n for n in model.graph.node for o in n.output}
    base = _output_error(model, folder, outputs, expected, feed)
    ordered = sorted(jumps.values(), key=lambda e: (-e.jump, e.node))
    by_name = {n.name: n for n in model.graph.node}
    costs = []
    for index, error in enumerate(ordered):
        node = by_name.get(error.node)
        if node is None or index >= MAX_EVALUATED:
            costs.append(NodeCost(error.node, error.op_type, 0.0, error.jump))
            continue
        original = list(node.input)
        for position, name in enumerate(original):
            if position == 0 or node.op_type not in WEIGHTED:  # data inputs; a weighted node's weights stay as quantized
                node.input[position] = _bypassed(name, producers)
        try:
            costs.append(NodeCost(error.node, error.op_type, base - _output_error(model, folder, outputs, expected, feed), error.jump))
        finally:
            del node.input[:]
            node.input.extend(original)
    evaluated = sorted(costs[:MAX_EVALUATED], key=lambda c: (-c.cost, c.node))
    log.debug("node costs (output error %.4f fully quantized): %s", base, ", ".join(f"{c.node} {c.cost:+.4f}" for c in evaluated[:8]))
    return evaluated + costs[MAX_EVALUATED:]


def _bypassed(name: str, producers: Mapping[str, object]) -> str:
    """The float tensor behind DequantizeLinear(QuantizeLinear(x)); ``name`` itself otherwise."""
    dq = producers.get(name)
    if getattr(dq, "op_type", "") != "DequantizeLinear":
        return name
    q = producers.get(dq.input[0])  # type: ignore[attr-defined]
    return q.input[0] if getattr(q, "op_type", "") == "QuantizeLinear" else name  # type: ignore[attr-defined]


def _feed_for(session, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    names = {i.name for i in session.get_inputs()}
    return {k: v for k, v in feed.items() if k in names}


def _run(session, outputs: list[str], feed: Mapping[str, np.ndarray], chunk: int = 8) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """``session``'s ``outputs`` on ``feed``, a few samples at a time (a whole feed at once held ResNet50's activations
    for 64 samples: 1.9 GB)."""
    feed = _feed_for(session, feed)
    count = len(next(iter(feed.values())))
    parts = [session.run(outputs, {k: v[start:start + chunk] for k, v in feed.items()}) for start in range(0, count, chunk)]
    return [np.concatenate([p[i] for p in parts]) for i in range(len(outputs))]


def _output_error(model, folder: Path, outputs: list[str], expected: list[np.ndarray], feed: Mapping[str, np.ndarray]) -> float:  # type: ignore[no-untyped-def]
    """The sum over outputs of ``model``'s (exact Q/DQ) L2 error against ``expected``, relative to the spread of ``expected``."""
    from pipeline.backend.onnxrt import session_from_proto

    session = session_from_proto(model, folder, exact_qdq=True)
    got = _run(session, outputs, feed)
    total = 0.0
    for ref, out in zip(expected, got):
        ref64, out64 = np.asarray(ref, np.float64), np.asarray(out, np.float64)
        spread = float(np.linalg.norm(ref64 - ref64.mean(axis=0)))
        total += float(np.linalg.norm(out64 - ref64) / spread) if spread > 0 else float(np.linalg.norm(out64 - ref64))
    return total
