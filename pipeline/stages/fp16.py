"""FP16 ONNX variant from the FP32 ONNX model (onnxconverter-common's float16 converter).

Graph inputs and outputs stay FP32 (``keep_io_types``), so clients and Triton configs do not
change; integer inputs (token ids) are untouched. Numerically sensitive ops stay FP32.
"""

from __future__ import annotations

import difflib
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from pathlib import Path

import numpy as np

from pipeline.core.onnx_files import atomic_onnx, graph_proto, has_external_data, save_onnx, save_streamed
from pipeline.core.errors import PipelineError, require

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


CONTROL_FLOW_OPS: tuple[str, ...] = ("Loop", "Scan", "If")
KEEP_OP_TYPES_FLAG = "--fp16-keep-op-types"
KEEP_NODES_FLAG = "--fp16-keep-nodes"


def fp16_onnx_from_onnx(
    src: Path,
    dst: Path,
    *,
    keep_op_types: Sequence[str] = (),
    keep_nodes: Sequence[str] = (),
) -> Path:  # each item of keep_op_types / keep_nodes may itself be a comma-separated list
    """Write an FP16 variant of the ONNX model ``src`` to ``dst`` and return ``dst``.

    Float initializers and activations become float16; graph inputs/outputs keep their FP32
    type (Casts are inserted at the edges). Ops of :data:`DEFAULT_FP32_OPS` and
    ``keep_op_types``, nodes named in ``keep_nodes``, and the converter's own list of ops without
    FP16 support stay FP32. Control-flow nodes (Loop, Scan, If: what a Keras GRU/LSTM or
    ``tf.cond`` becomes) are converted with their subgraphs; if that gives an invalid model, they
    are kept FP32 as islands (Casts at their boundaries, outer tensors they read cast to FP32)
    and one line says so. The result passes ``onnx.checker`` with full type checking and loads
    in ONNX Runtime.
    """
    import onnx

    src, dst = Path(src), Path(dst)
    require(src.is_file(), f"ONNX model '{src}' does not exist", "run the ONNX export stage first")
    external = has_external_data(src)  # the variant keeps its weights in a data file as its source does
    original = _loaded(src, external)
    op_types = _checked_op_types(keep_op_types)
    node_names = _checked_node_names(original, keep_nodes, src)
    blocked = set(DEFAULT_FP32_OPS) | set(op_types)
    integer_casts = _integer_casts(original)
    islands: list[onnx.NodeProto] = []
    with atomic_onnx(dst) as tmp:
        # converted in place and validated from the file written: the FP32 weights are not held twice
        model, problem = _converted(original, blocked, node_names | integer_casts, src, tmp, external)
        if problem is not None:
            original = _loaded(src, external)  # the first try consumed it
            islands = [n for n in original.graph.node if n.op_type in CONTROL_FLOW_OPS and n.op_type not in blocked and n.name not in node_names]
            if not islands:
                raise _invalid(src, problem)
            model, retry_problem = _converted(original, blocked, node_names | integer_casts | {n.name for n in islands}, src, tmp, external)
            if retry_problem is not None:
                raise _invalid(src, retry_problem)
            log.warning(
                "FP16: kept %s in FP32 (with %s subgraph%s): converting %s to FP16 gave an invalid model (%s)",
                ", ".join(f"{n.op_type} '{n.name}'" for n in islands),
                "its" if len(islands) == 1 else "their",
                "" if len(islands) == 1 else "s",
                "it" if len(islands) == 1 else "them",
                problem,
            )
    kept = sorted({n.op_type for n in model.graph.node if n.op_type in blocked})
    log.info(
        "wrote FP16 model %s (kept in FP32: op types %s; nodes %s)",
        dst,
        ", ".join(kept) or "none",
        ", ".join(sorted(node_names | {n.name for n in islands})) or "none",
    )
    return dst


def _loaded(src: Path, external: bool):
    """``src`` to convert: with a data file, its graph only (the weights are converted on their way to the new file)."""
    import onnx

    model = graph_proto(src) if external else onnx.load(str(src))
    _name_nodes(model.graph, set())
    return model


def _float16_block(tensor, block: bytes) -> bytes:  # type: ignore[no-untyped-def]
    """A block of an external tensor on its way to the FP16 file: float32 values of a tensor now typed float16 become
    float16 as the converter makes inline ones (its clamping); anything else is copied."""
    import onnx
    from onnxconverter_common import float16

    count = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
    length = next((int(e.value) for e in tensor.external_data if e.key == "length"), -1)  # in the source file
    if tensor.data_type != onnx.TensorProto.FLOAT16 or length != count * 4:  # not converted, or float16 already
        return block
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converter warns per block about the values it clamps
        return float16.convert_np_to_float16(np.frombuffer(block, np.float32), 1e-7, 1e4).tobytes()


def _converted(model, blocked: set[str], node_names: set[str], src: Path, dst: Path, external: bool):
    """Convert ``model`` (in place) and save it at ``dst``; return (model, None) if it is valid, else (None, problem)."""
    import onnx
    from onnxconverter_common import float16

    float_io = {v.name for v in [*model.graph.input, *model.graph.output] if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    op_block = set(float16.DEFAULT_OP_BLOCK_LIST) | blocked
    kept = lambda node: node.op_type in op_block or node.name in node_names  # noqa: E731
    casts_to_float = {n.name for _, n in _walk(model.graph, kept) if n.op_type == "Cast" and not kept(n) and _cast_to(n) == onnx.TensorProto.FLOAT}
    float_inits = {i.name: i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    island_refs = {id(n): _outer_refs_of(n) for n in model.graph.node if kept(n) and _has_subgraphs(n)}
    island_inits = {name: _copy(float_inits[name]) for refs in island_refs.values() for name in refs if name in float_inits}
    _unshare_kept_initializers(model.graph, kept)
    try:
        model = float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=sorted(op_block), node_block_list=sorted(node_names))
    except ValueError as exc:  # e.g. "The model is already converted to float16"
        raise PipelineError(f"cannot convert '{src}' to FP16: {exc}", "pass the FP32 ONNX model") from None

    _retarget_casts(model.graph, casts_to_float, kept)
    _restore_fp32_outputs(model.graph, float_io, op_block)
    _feed_islands_fp32(model.graph, kept, island_inits)
    _check_io_types(model.graph, float_io, src)
    if external:
        save_streamed(model, dst, src.parent, _float16_block)
    else:
        save_onnx(model, dst, external=False)
    problem = _validation_problem(dst)
    return (model, None) if problem is None else (None, problem)


COMPARISONS = ("Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal")


def _integer_casts(model) -> set[str]:
    """Casts of integer or bool tensors to float32 (token ids, padding masks, positions), and the
    comparisons that read them: kept FP32, so no integer input is ever cast to float16 (float16
    holds integers exactly only up to 2048; a vocabulary's ids go far beyond). Where an FP16 op
    reads such a cast, the converter casts its float32 output down at that edge."""
    import onnx
    from onnx import TensorProto

    integer = {TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.UINT16,
               TensorProto.UINT32, TensorProto.UINT64, TensorProto.BOOL}
    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # shape inference refuses some exported graphs; then only the graph inputs' types are known
        graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    types.update({i.name: i.data_type for i in graph.initializer})
    casts = {n.name: n.output[0] for n in model.graph.node if n.op_type == "Cast" and types.get(n.input[0]) in integer
             and _cast_to(n) == TensorProto.FLOAT}
    outputs = set(casts.values())
    return set(casts) | {n.name for n in model.graph.node if n.op_type in COMPARISONS and outputs & set(n.input)}


def _unshare_kept_initializers(graph, kept: Callable) -> None:
    """Give kept-FP32 nodes their own copy of a float initializer that FP16 nodes read too. The converter
    leaves an initializer FP32 when any kept node reads it, and then the FP16 readers get an FP32
    input: tf2onnx's constant deduplication shares scalars such as 1.0 across the graph (exact GELU's
    1 - Erf(x) with a LayerNorm's or a Softmax mask's 1.0)."""
    from onnx import TensorProto

    inits = {i.name: i for i in graph.initializer if i.data_type == TensorProto.FLOAT}
    readers: dict[str, set[bool]] = {}
    for node in graph.node:
        for name in node.input:
            if name in inits:
                readers.setdefault(name, set()).add(bool(kept(node)))
    shared = {name for name, kinds in readers.items() if kinds == {True, False}}
    for name in sorted(shared):
        copy = _copy(inits[name])
        copy.name = f"{name}__fp32"
        graph.initializer.append(copy)
    for node in graph.node:
        if kept(node):
            for index, name in enumerate(node.input):
                if name in shared:
                    node.input[index] = f"{name}__fp32"


def _validation_problem(path: Path) -> str | None:
    """None if the model at ``path`` passes ``onnx.checker`` (full check) and loads in ONNX Runtime, else the first line of why not."""
    import onnx
    import onnxruntime as ort

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        return str(exc).strip().splitlines()[0]
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises its own pybind types (Fail, InvalidGraph, ...)
        return "ONNX Runtime cannot load it: " + str(exc).strip().splitlines()[0]
    return None


def _invalid(src: Path, problem: str) -> PipelineError:
    return PipelineError(
        f"the FP16 model made from '{src}' is invalid: {problem}",
        f"keep the offending op type or node in FP32 with {KEEP_OP_TYPES_FLAG} TYPE,... or {KEEP_NODES_FLAG} NAME,... "
        "(the node is named in the message), or skip --fp16 for this model",
    )


def _checked_op_types(op_types: Sequence[str]) -> list[str]:
    from onnx import defs

    cleaned = [t.strip() for item in op_types for t in item.split(",") if t.strip()]
    unknown = [t for t in cleaned if not defs.has(t)]
    if unknown:
        known = sorted({s.name for s in defs.get_all_schemas()})
        hints = {t: difflib.get_close_matches(t, known, n=1) for t in unknown}
        shown = ", ".join(f"'{t}'" + (f" (did you mean {h[0]}?)" if h else "") for t, h in hints.items())
        raise PipelineError(
            f"{KEEP_OP_TYPES_FLAG} names unknown ONNX op type(s) {shown}",
            f"pass ONNX op types as in the model's graph, e.g. {KEEP_OP_TYPES_FLAG} Softmax,LayerNormalization",
        )
    return cleaned


def _checked_node_names(model, names: Sequence[str], src: Path) -> set[str]:
    wanted = [n.strip() for item in names for n in item.split(",") if n.strip()]
    existing = {node.name for _, node in _walk(model.graph, lambda _n: False)}
    missing = [n for n in wanted if n not in existing]
    if missing:
        hints = {n: difflib.get_close_matches(n, sorted(existing), n=1) for n in missing}
        shown = ", ".join(f"'{n}'" + (f" (did you mean '{h[0]}'?)" if h else "") for n, h in hints.items())
        raise PipelineError(
            f"{KEEP_NODES_FLAG} names node(s) {shown} that '{src}' does not have",
            f"pass node names of the FP32 ONNX model '{src}' (as Netron or onnx.load(...).graph.node show them) to {KEEP_NODES_FLAG}",
        )
    return set(wanted)


def _cast_to(node) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _copy(proto):
    clone = type(proto)()
    clone.CopyFrom(proto)
    return clone


def _subgraphs(node) -> list:
    return [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]


def _has_subgraphs(node) -> bool:
    return bool(_subgraphs(node))


def _walk(graph, kept: Callable) -> Iterator[tuple[Any, Any]]:
    """(graph, node) for every node, descending into subgraphs except those of ``kept`` nodes."""
    for node in graph.node:
        yield graph, node
        if not kept(node):
            for sub in _subgraphs(node):
                yield from _walk(sub, kept)


def _outer_refs(graph) -> set[str]:
    """Names a (sub)graph reads from enclosing scopes: used, but not defined inside it."""
    defined = {v.name for v in graph.input} | {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output}
    used: set[str] = set()
    for node in graph.node:
        used.update(i for i in node.input if i)
        for sub in _subgraphs(node):
            used |= _outer_refs(sub)
    used.update(o.name for o in graph.output)
    return used - defined


def _outer_refs_of(node) -> set[str]:
    refs: set[str] = set()
    for sub in _subgraphs(node):
        refs |= _outer_refs(sub)
    return refs


def _rename_refs(graph, old: str, new: str) -> None:
    """Point every use of ``old`` in ``graph`` and its subgraphs at ``new`` (``old`` is from an outer scope)."""
    for node in graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        for sub in _subgraphs(node):
            _rename_refs(sub, old, new)
    for output in graph.output:
        if output.name == old:  # a subgraph passing an outer tensor straight through
            output.name = new


def _name_nodes(graph, seen: set[str]) -> None:
    """Give every node (subgraphs included) a unique name: the converter derives new tensor names
    from node names, so two unnamed nodes would produce clashing Casts; and --fp16-keep-nodes
    needs a name to point at."""
    for index, node in enumerate(graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
            while node.name in seen:
                node.name += "_"
        seen.add(node.name)
        for sub in _subgraphs(node):
            _name_nodes(sub, seen)


def _retarget_casts(graph, casts_to_float: set[str], kept: Callable) -> None:
    """The converter leaves ``Cast(to=FLOAT)`` nodes alone (e.g. int mask → float) while it marks
    their outputs float16; point them at float16 so their consumers get the type they expect."""
    from onnx import TensorProto

    for _, node in _walk(graph, kept):
        if node.name in casts_to_float:
            for attr in node.attribute:
                if attr.name == "to" and attr.i == TensorProto.FLOAT:
                    attr.i = TensorProto.FLOAT16


def _feed_islands_fp32(graph, kept: Callable, original_inits: dict) -> None:
    """A node kept in FP32 whose subgraphs read outer tensors (a Loop body reading the GRU weights)
    gets those tensors in FP32: weights as untouched FP32 copies, activations through a Cast.
    The converter only casts a kept node's explicit inputs, not what its subgraphs read."""
    from onnx import TensorProto, helper

    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    inits = {i.name: i for i in graph.initializer}
    rebuilt = []
    for node in graph.node:
        if kept(node) and _has_subgraphs(node):
            for ref in sorted(_outer_refs_of(node)):
                fp32_name = f"{ref}__fp32"
                if ref in inits and inits[ref].data_type == TensorProto.FLOAT16 and ref in original_inits:
                    if fp32_name not in inits:
                        copy = _copy(original_inits[ref])
                        copy.name = fp32_name
                        graph.initializer.append(copy)
                        inits[fp32_name] = copy
                elif ref not in inits and types.get(ref) == TensorProto.FLOAT16:
                    if fp32_name not in types:
                        rebuilt.append(helper.make_node("Cast", [ref], [fp32_name], to=TensorProto.FLOAT, name=f"{fp32_name}_cast"))
                        types[fp32_name] = TensorProto.FLOAT
                else:
                    continue
                for sub in _subgraphs(node):
                    _rename_refs(sub, ref, fp32_name)
        rebuilt.append(_copy(node))
    del graph.node[:]
    graph.node.extend(rebuilt)
    used = {i for _, n in _walk(graph, lambda _n: False) for i in n.input} | {o.name for o in graph.output}
    unused = [i for i in graph.initializer if i.name not in used]
    for init in unused:  # FP16 copies only the islands read
        graph.initializer.remove(init)


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
