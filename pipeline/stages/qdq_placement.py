"""Q/DQ placement where TensorRT fuses, applied after ONNX Runtime's QDQ quantizer.

ONNX Runtime puts Q/DQ on the inputs of Conv/ConvTranspose/Gemm/MatMul (weights per output
channel). Following the TensorRT developer guide's Q/DQ placement recommendations
("Working with Quantized Types"), this pass then:

* **residual Add**: quantizes *both* inputs of an ``Add`` of two activations where one comes
  from a Conv/ConvTranspose. With only one input quantized (ORT reuses the DQ of a tensor that
  also feeds a Conv), TensorRT cannot fuse the Add into the Conv as an int8 residual and
  runs it separately; with both, Conv+Add(+ReLU) become one int8 kernel;
* **pooling**: quantizes the input of ``AveragePool`` (TensorRT fuses DQ→AveragePool→Q into an
  int8 pooling). ``MaxPool`` commutes with Q/DQ, and TensorRT moves the Q of the next layer
  backward across it, so it needs none of its own. ``GlobalAveragePool`` (the reduction before a
  classifier head) is left in float: quantizing the full feature map before averaging flipped 2
  of 449 samples of the bundled model (0 without), for a layer that costs next to nothing;
* **Concat**: gives every input of a ``Concat`` whose inputs are partly quantized, or whose
  output feeds a quantized layer, its own Q/DQ with one common scale (the widest input range),
  and the Concat output's Q/DQ that scale too. TensorRT compares the scales of Q layers across a
  Concat and propagates them backward only when they are equal, which lets the concatenation
  run in int8 without requantizing.

Activation ranges come from the calibration cache (the calibrator collects the inputs and
outputs of these ops too). Everything stays symmetric int8 with zero point 0, outputs of
weighted layers stay unquantized (the guide's default), biases float.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping

import numpy as np

log = logging.getLogger(__name__)

WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
POOLING = ("AveragePool",)
# Op types whose inputs/outputs the calibrator must see for this pass.
CALIBRATED_OP_TYPES = (*WEIGHTED, "Add", "Concat", *POOLING)
QMAX = 127.0


def place_qdq(model, ranges: Mapping[str, tuple[float, float]]) -> dict[str, int]:
    """Rewrite the ORT-quantized ``model`` (ModelProto, in place) as described in the module
    docstring; ``ranges`` maps tensor names to calibrated (low, high). Returns counts of what
    was quantized: ``{"residual_add": n, "pooling": n, "concat": n}``."""
    graph = model.graph
    editor = _Editor(graph, ranges)
    counts = {"residual_add": 0, "pooling": 0, "concat": 0}
    for node in list(graph.node):
        if node.op_type == "Add" and _is_residual(node, editor):
            if sum(editor.quantize_input(node, i) for i in range(2)):
                counts["residual_add"] += 1
        elif node.op_type in POOLING:
            counts["pooling"] += editor.quantize_input(node, 0)
        elif node.op_type == "Concat" and _concat_needs_qdq(node, editor):
            counts["concat"] += editor.unify_concat(node)
    editor.commit()
    log.info(
        "Q/DQ placed for TensorRT fusion: %d residual Add(s) with both inputs quantized, %d pooling input(s), %d Concat(s) with one scale",
        counts["residual_add"],
        counts["pooling"],
        counts["concat"],
    )
    return counts


def float_source(name: str, producers: Mapping[str, object]) -> str:
    """The float tensor behind a DequantizeLinear(QuantizeLinear(x)) pair, else ``name`` itself
    (``producers``: tensor name → the node that outputs it)."""
    dq = producers.get(name)
    if getattr(dq, "op_type", None) != "DequantizeLinear":
        return name
    q = producers.get(dq.input[0])  # type: ignore[attr-defined]
    return str(q.input[0]) if getattr(q, "op_type", None) == "QuantizeLinear" else name  # type: ignore[attr-defined]


def _is_residual(node, editor: _Editor) -> bool:
    if len(node.input) != 2 or any(editor.is_constant(i) for i in node.input):
        return False  # a bias or constant add, not a skip connection
    # Only a quantized Conv fuses with the Add as an int8 residual; one kept float (--int8-keep-nodes) does not.
    return any(editor.float_producer_type(i) in ("Conv", "ConvTranspose") and editor.produced_by_quantized(i) for i in node.input)


def _concat_needs_qdq(node, editor: _Editor) -> bool:
    inputs = [i for i in node.input if not editor.is_constant(i)]
    if len(inputs) < 2:
        return False
    partly = any(editor.dq_of(i) is not None for i in inputs)
    feeds_quantized = editor.output_feeds_quantized(node.output[0])
    return partly or feeds_quantized


class _Editor:
    """Graph edits collected per node and written back in topological order."""

    def __init__(self, graph, ranges: Mapping[str, tuple[float, float]]) -> None:
        from onnx import numpy_helper

        self.graph = graph
        self.ranges = ranges
        counts = Counter(n.name for n in graph.node)
        for index, node in enumerate(graph.node):  # edits are keyed by node name
            if not node.name or counts[node.name] > 1:
                node.name = f"{node.op_type}_{index}_unnamed"
        self.producers = {o: n for n in graph.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.consts = {i.name: i for i in graph.initializer}
        self.values = {name: numpy_helper.to_array(init) for name, init in self.consts.items() if init.data_type == 1 and not init.dims}
        self.before: dict[str, list] = {}  # node name -> nodes to insert before it
        self.replaced: set[str] = set()
        self.counter = 0

    def is_constant(self, name: str) -> bool:
        producer = self.producers.get(name)
        return name in self.consts or (producer is not None and producer.op_type == "Constant")

    def dq_of(self, name: str):
        producer = self.producers.get(name)
        return producer if producer is not None and producer.op_type == "DequantizeLinear" else None

    def float_source(self, name: str) -> str:
        return float_source(name, self.producers)

    def float_producer_type(self, name: str) -> str | None:
        producer = self.producers.get(self.float_source(name))
        return producer.op_type if producer is not None else None

    def produced_by_quantized(self, name: str) -> bool:
        """Whether the node behind ``name`` (looking through a DQ(Q(x)) pair) reads its data input through a DQ."""
        producer = self.producers.get(self.float_source(name))
        return producer is not None and bool(producer.input) and self.dq_of(producer.input[0]) is not None

    def output_feeds_quantized(self, name: str) -> bool:
        for consumer in self.consumers.get(name, []):
            if consumer.op_type == "QuantizeLinear":
                return True
        return False

    def scale_for(self, name: str) -> float | None:
        dq = self.dq_of(name)
        if dq is not None and dq.input[1] in self.values:
            return float(self.values[dq.input[1]])
        low_high = self.ranges.get(self.float_source(name))
        if low_high is None:
            return None
        absmax = float(max(np.abs(np.asarray(low_high[0])).max(), np.abs(np.asarray(low_high[1])).max()))
        return absmax / QMAX if absmax > 0 else None

    def quantize_input(self, node, index: int, scale: float | None = None, *, dedicated: bool = False) -> int:
        """Route input ``index`` of ``node`` through a new Q/DQ pair; 1 if done, 0 if not needed or no range."""
        name = node.input[index]
        if self.dq_of(name) is not None and not dedicated:
            return 0
        scale = scale if scale is not None else self.scale_for(name)
        if scale is None:
            log.debug("no calibrated range for '%s' (input of %s '%s'); left in float", name, node.op_type, node.name)
            return 0
        source = self.float_source(name)
        node.input[index] = self._pair(source, scale, node)
        return 1

    def unify_concat(self, node) -> int:
        inputs = [(i, n) for i, n in enumerate(node.input) if not self.is_constant(n)]
        found = [self.scale_for(n) for _, n in inputs]
        scales = [s for s in found if s is not None]
        if len(scales) < len(found):
            log.debug("Concat '%s': an input has no calibrated range; left as it is", node.name)
            return 0
        common = max(scales)
        for index, _ in inputs:
            self.quantize_input(node, index, common, dedicated=True)
        for consumer in self.consumers.get(node.output[0], []):
            if consumer.op_type == "QuantizeLinear":
                self._set_scale(consumer, common)
                for dq in self.consumers.get(consumer.output[0], []):
                    if dq.op_type == "DequantizeLinear":
                        self._set_scale(dq, common)
        return 1

    def _set_scale(self, qdq_node, scale: float) -> None:
        from onnx import numpy_helper

        name = f"{qdq_node.name or qdq_node.output[0]}_unified_scale"
        if name not in self.consts:
            init = numpy_helper.from_array(np.array(scale, np.float32), name)
            self.graph.initializer.append(init)
            self.consts[name] = init
        self.replaced.add(qdq_node.input[1])
        qdq_node.input[1] = name

    def _pair(self, source: str, scale: float, consumer) -> str:
        from onnx import helper, numpy_helper

        self.counter += 1
        stem = f"{source}_placed{self.counter}"
        scale_name, zp_name = f"{stem}_scale", f"{stem}_zero_point"
        self.graph.initializer.extend(
            [numpy_helper.from_array(np.array(scale, np.float32), scale_name), numpy_helper.from_array(np.array(0, np.int8), zp_name)]
        )
        self.consts[scale_name] = self.graph.initializer[-2]
        self.consts[zp_name] = self.graph.initializer[-1]
        q = helper.make_node("QuantizeLinear", [source, scale_name, zp_name], [f"{stem}_q"], name=f"{stem}_QuantizeLinear")
        dq = helper.make_node("DequantizeLinear", [f"{stem}_q", scale_name, zp_name], [f"{stem}_dq"], name=f"{stem}_DequantizeLinear")
        self.before.setdefault(consumer.name, []).extend([q, dq])
        return f"{stem}_dq"

    def commit(self) -> None:
        """Insert the new Q/DQ pairs right before their consumers (inputs are produced earlier)."""
        nodes = []
        for node in self.graph.node:
            nodes.extend(self.before.get(node.name, []))
            nodes.append(node)
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        used = {i for n in self.graph.node for i in n.input}
        for init in [i for i in self.graph.initializer if i.name in self.replaced and i.name not in used]:
            self.graph.initializer.remove(init)  # scales replaced by a Concat's common one
