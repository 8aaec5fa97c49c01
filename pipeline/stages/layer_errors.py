"""Where an INT8 model's error comes from: the error of every quantized layer, compared with FP32.

Polygraphy's way (``polygraphy run --onnx-outputs mark all``): both models run on the same batch
with the inputs and outputs of every weighted layer (Conv, ConvTranspose, Gemm, MatMul) marked as
extra outputs; tensor names are shared, because the INT8 model is the FP32 graph with Q/DQ pairs
inserted in front of those layers. For each layer the relative L2 error (``‖int8 − fp32‖ / ‖fp32‖``)
of its data input and of its output are measured; their difference, the *jump*, is the error that
layer's quantization adds. The layers with the largest jumps are the ones to keep in float
(``--int8-keep-nodes``). A model whose error grows steadily through every layer, with no layer
standing out, is amplifying small perturbations (an untrained or chaotic network), which no Q/DQ
placement can fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.backend.onnxrt import session_from_proto
from pipeline.core.onnx_files import graph_proto
from pipeline.stages.qdq_placement import WEIGHTED, float_source

CHUNK = 2  # samples run through both marked models at once


@dataclass(frozen=True)
class LayerError:
    """The INT8-vs-FP32 error of one weighted layer (relative L2 of its data input and its output)."""

    node: str
    op_type: str
    input_error: float
    output_error: float

    @property
    def jump(self) -> float:
        return self.output_error - self.input_error

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "jump": self.jump}


def layer_errors_from_models(fp32: Path, int8: Path, feed: Mapping[str, np.ndarray], op_types: Sequence[str] = WEIGHTED) -> list[LayerError]:
    """Run ``fp32`` and ``int8`` (ONNX, the INT8 one with exact Q/DQ semantics) on ``feed`` with the data inputs
    and the output of every node of ``op_types`` that reads a quantized tensor marked, and return one LayerError
    per such node of the INT8 model in graph order, named as there (ONNX Runtime's pre-quantization pass may have
    fused a MatMul and its bias Add into one Gemm). A node of several data inputs (an Add, a Concat) takes the
    largest of their errors as its input error. Nodes whose tensors the FP32 model lacks are left out."""
    import tempfile

    import onnx

    from pipeline.stages.int8_calibrate import prepared_model

    quantized = graph_proto(int8)  # the graph; the weights stay in their data file, if any
    producers = {o: n for n in quantized.graph.node for o in n.output}
    graph_inputs = {x.name for x in quantized.graph.input}

    def data_inputs(node) -> list[str]:  # type: ignore[no-untyped-def]
        sources = [float_source(i, producers) for i in (node.input[:1] if node.op_type in WEIGHTED else node.input) if i]
        return [i for i in sources if i in graph_inputs or (i in producers and producers[i].op_type != "Constant")]

    def reads_quantized(node) -> bool:  # type: ignore[no-untyped-def]
        return any(getattr(producers.get(i), "op_type", "") == "DequantizeLinear" for i in node.input)

    layers = [(n.name, n.op_type, data_inputs(n), n.output[0]) for n in quantized.graph.node if n.op_type in op_types and reads_quantized(n)]
    wanted = sorted({name for _, _, inputs, out in layers for name in (*inputs, out)})
    # The INT8 graph was quantized from ORT's prepared FP32 graph (BatchNorm folded, tensors renamed):
    # its float tensors carry that graph's names, so that graph is the reference.
    sums: dict[str, np.ndarray] = {}  # per tensor: Σ(int8 − fp32)², Σ fp32², Σ int8² over the feed
    with tempfile.TemporaryDirectory(prefix="layer-errors.") as tmp:
        reference = _marked_session(prepared_model(fp32, Path(tmp) / "prepared.onnx"), wanted)
        quantized_session = _marked_session(Path(int8), wanted)
        count = len(next(iter(feed.values())))
        # a few samples at a time: every marked tensor of a whole feed at once held 11.4 GB for ResNet50 (64 samples)
        for start in range(0, count, CHUNK):
            chunk = {k: np.asarray(v)[start:start + CHUNK] for k, v in feed.items()}
            values32, values8 = _run_marked(reference, wanted, chunk), _run_marked(quantized_session, wanted, chunk)
            for name in values32.keys() & values8.keys():
                ref, other = np.asarray(values32[name], np.float64), np.asarray(values8[name], np.float64)
                sums[name] = sums.get(name, np.zeros(3)) + [np.sum((other - ref) ** 2), np.sum(ref**2), np.sum(other**2)]
    errors = []
    for name, op_type, inputs, out in layers:
        if out in sums:
            in_error = max((_relative_l2(sums[i]) for i in inputs if i in sums), default=0.0)
            errors.append(LayerError(name, op_type, in_error, _relative_l2(sums[out])))
    return errors


def worst_layers(errors: list[LayerError], count: int = 3) -> list[LayerError]:
    """The ``count`` layers whose quantization adds the most error (largest jumps, positive only)."""
    return sorted((e for e in errors if e.jump > 0), key=lambda e: e.jump, reverse=True)[:count]


def describe(errors: list[LayerError], count: int = 3) -> str:
    """One sentence: how the error grows and which layers add the most, with the flag to keep them float."""
    if not errors:
        return "no weighted layer could be compared"
    worst = worst_layers(errors, min(count, len(errors) - 1))  # never every layer: all of them in float is no INT8
    first, last = errors[0], errors[-1]
    growth = f"INT8 error grows from {first.output_error:.1%} after '{first.node}' to {last.output_error:.1%} after '{last.node}'"
    if not worst:
        return growth
    shown = ", ".join(f"'{e.node}' (+{e.jump:.1%})" for e in worst)
    return f"{growth}; largest added by {shown}: keep them in float with --int8-keep-nodes {','.join(e.node for e in worst)}"


def _marked_session(path: Path, names: list[str]):  # type: ignore[no-untyped-def]
    """An exact-Q/DQ session (as the accuracy gate) of the model at ``path`` with ``names`` marked as outputs."""
    import onnx

    model = graph_proto(path)
    produced = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    present = {o.name for o in model.graph.output}
    marked = [n for n in names if n in produced and n not in present]
    model.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in marked)
    return session_from_proto(model, Path(path).parent, exact_qdq=True)


def _run_marked(session, names: list[str], feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    outputs = [o.name for o in session.get_outputs() if o.name in names]
    inputs = {i.name for i in session.get_inputs()}
    values = dict(zip(outputs, session.run(outputs, {k: v for k, v in feed.items() if k in inputs})))
    values.update({k: np.asarray(v) for k, v in feed.items() if k in names})
    return values


def _relative_l2(sums: np.ndarray) -> float:
    """‖int8 − fp32‖ / ‖fp32‖ from the sums of :func:`layer_errors_from_models` (‖int8‖ where fp32 is all zeros)."""
    diff, ref, other = (float(x) for x in sums)
    return float(np.sqrt(diff / ref)) if ref > 0 else float(np.sqrt(other))