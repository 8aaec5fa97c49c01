"""FP16 ONNX variant from the FP32 ONNX model (onnxconverter-common's float16 converter).

Graph inputs and outputs stay FP32 (``keep_io_types``), so clients and Triton configs do not
change; integer inputs (token ids) are untouched. Numerically sensitive ops stay FP32.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pipeline.atomic import clear_leftovers
from pipeline.errors import PipelineError, require

log = logging.getLogger(__name__)

# Ops kept in FP32 (their inputs are cast up, outputs cast down), because FP16 (max 65504,
# 11-bit mantissa) breaks them on ordinary activations:
DEFAULT_FP32_OPS: tuple[str, ...] = (
    "Softmax",  # exp + normalising sum: tiny probabilities flush to zero, the sum over long axes loses digits
    "LogSoftmax",  # same, and log of a flushed zero is -inf
    "LayerNormalization",  # mean of squares overflows for |x| > 256 and cancels badly (E[x²] - E[x]²)
    "ReduceSumSquare",  # sum of squares overflows
    "ReduceL2",  # sqrt of a sum of squares that overflows
    "ReduceLogSumExp",  # exp overflows for x > 11
    "Exp",  # overflows for x > 11 (exp(11.1) > 65504)
    "Pow",  # x² overflows for |x| > 256; tf2onnx builds layer/L2 norms from Pow
)


def fp16_onnx_from_onnx(src: Path, dst: Path, *, keep_fp32_ops: Sequence[str] = DEFAULT_FP32_OPS) -> Path:
    """Write an FP16 variant of the ONNX model ``src`` to ``dst`` and return ``dst``.

    Float initializers and activations become float16; graph inputs/outputs keep their FP32
    type (Casts are inserted at the edges); ops in ``keep_fp32_ops`` plus the converter's own
    list of ops without FP16 support stay FP32. The result passes ``onnx.checker`` with full
    type checking.
    """
    import onnx
    from onnxconverter_common import float16

    src, dst = Path(src), Path(dst)
    require(src.is_file(), f"ONNX model '{src}' does not exist", "run the ONNX export stage first")

    model = onnx.load(str(src))
    float_io = {v.name for v in [*model.graph.input, *model.graph.output] if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    _name_nodes(model.graph)
    blocked = set(float16.DEFAULT_OP_BLOCK_LIST) | set(keep_fp32_ops)
    casts_to_float = {n.name for n in model.graph.node if n.op_type == "Cast" and "Cast" not in blocked and _cast_to(n) == onnx.TensorProto.FLOAT}
    try:
        model = float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=sorted(blocked))
    except ValueError as exc:  # e.g. "The model is already converted to float16"
        raise PipelineError(f"cannot convert '{src}' to FP16: {exc}", "pass the FP32 ONNX model") from None

    _retarget_casts(model.graph, casts_to_float)
    _restore_fp32_outputs(model.graph, float_io, blocked)
    _check_io_types(model.graph, float_io, src)

    dst.parent.mkdir(parents=True, exist_ok=True)
    clear_leftovers(dst)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; the model is an ordinary artifact
    try:
        onnx.save(model, tmp)
        try:
            onnx.checker.check_model(tmp, full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
            raise PipelineError(
                f"the FP16 model made from '{src}' is invalid: {str(exc).splitlines()[0]}",
                "keep the offending op in FP32 (keep_fp32_ops) or skip --fp16 for this model",
            ) from None
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    kept = sorted({n.op_type for n in model.graph.node if n.op_type in blocked})
    log.info("wrote FP16 model %s (kept in FP32: %s)", dst, ", ".join(kept) or "nothing")
    return dst


def _cast_to(node) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _name_nodes(graph) -> None:
    """Give every node a unique name: the converter derives new tensor names from node names,
    so two unnamed nodes would produce clashing Casts."""
    seen: set[str] = set()
    for index, node in enumerate(graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
            while node.name in seen:
                node.name += "_"
        seen.add(node.name)


def _retarget_casts(graph, casts_to_float: set[str]) -> None:
    """The converter leaves ``Cast(to=FLOAT)`` nodes alone (e.g. int mask → float) while it marks
    their outputs float16; point them at float16 so their consumers get the type they expect."""
    from onnx import TensorProto

    for node in graph.node:
        if node.name in casts_to_float:
            for attr in node.attribute:
                if attr.name == "to" and attr.i == TensorProto.FLOAT:
                    attr.i = TensorProto.FLOAT16


def _restore_fp32_outputs(graph, float_io: set[str], blocked: set[str]) -> None:
    """When a kept-FP32 op (e.g. the final Softmax) produces a graph output, the converter casts
    its result to float16 and retypes the output as float16, despite keep_io_types. Drop that
    Cast and let the FP32 op write the graph output directly (no lossy fp32→fp16→fp32 trip)."""
    from onnx import TensorProto, helper

    producers = {out: node for node in graph.node for out in node.output}
    for output in graph.output:
        ttype = output.type.tensor_type
        if output.name not in float_io or ttype.elem_type != TensorProto.FLOAT16:
            continue
        cast = producers.get(output.name)
        source = producers.get(cast.input[0]) if cast is not None and cast.op_type == "Cast" else None
        if cast is not None and source is not None and source.op_type in blocked:
            inner = cast.input[0]
            graph.node.remove(cast)
            for i, name in enumerate(source.output):
                if name == inner:
                    source.output[i] = output.name
            for j, info in enumerate(graph.value_info):
                if info.name == inner:
                    del graph.value_info[j]
                    break
        else:  # anything else: cast back up at the edge
            renamed = f"{output.name}__fp16"
            for node in graph.node:
                node.output[:] = [renamed if o == output.name else o for o in node.output]
                node.input[:] = [renamed if i == output.name else i for i in node.input]
            graph.node.append(helper.make_node("Cast", [renamed], [output.name], to=TensorProto.FLOAT, name=f"{renamed}_to_fp32"))
        ttype.elem_type = TensorProto.FLOAT


def _check_io_types(graph, float_io: set[str], src: Path) -> None:
    from onnx import TensorProto

    changed = [v.name for v in [*graph.input, *graph.output] if v.name in float_io and v.type.tensor_type.elem_type != TensorProto.FLOAT]
    if changed:
        raise PipelineError(
            f"the FP16 conversion of '{src}' changed the type of graph inputs/outputs {changed}",
            "report this model; skip --fp16 for it meanwhile",
        )
