"""Will TensorRT's ONNX parser take this graph? The one part of the engine stage that can be
checked without TensorRT.

The rules are data: ``pipeline/backend/onnx_trt_ops.json`` encodes onnx-tensorrt's published
operator list (``docs/operators.md``: which ops parse, for which tensor types, with which
restrictions) and what each 10.x release changed (``CHANGELOG.md``), with its source noted in the
file. Targets, named by what runs them: **10.8**, the default — what ``build``'s engine stage needs
(``tensorrt>=10.8``, the data's ``build_minimum``); **10.5**, what the NGC ``tritonserver:24.10-py3``
image runs (its ONNX Runtime TensorRT EP parses with it); **10.15**, the operator list that was read.

What is checked, per node (subgraphs of Loop/If/Scan and the bodies of model-local functions
included): the op is listed and supported in the target version; its tensor type is one of the
listed types (from ONNX shape inference); the encoded restrictions (inputs that must be constants,
attribute values, output counts, input ranks); the model's ``ai.onnx`` opset is in the target's
documented range; ops outside the default ONNX domain that are not model-local functions need a
plugin. Rules checked against onnx-tensorrt's ``docs/operators.md`` (the 10.15 list; the data file
says where a target's value is derived): TopK's ``K`` must be below 3840 when it is a constant and
is not required to be one (that was the 8.x list); a call of a model-local function is parsed by
expanding it, so its body is checked instead of asking for a plugin. What cannot be checked here:
whether a kernel exists for a layer on a given GPU, and restrictions on values only known at build
time (a computed ``K``).

Where TensorRT-RTX is installed, ``build`` checks with its real parser and builder instead
(:mod:`pipeline.stages.trt_check`) and keeps only :func:`version_gated`: the rules this data dates to a
TensorRT release after the build minimum, where a newer real parser is known to differ from 10.8's.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from pipeline.core.errors import PipelineError

DATA_FILE = "onnx_trt_ops.json"
_TYPE_NAMES = {
    "FLOAT": "FP32", "FLOAT16": "FP16", "BFLOAT16": "BF16", "DOUBLE": "DOUBLE", "INT8": "INT8", "UINT8": "UINT8",
    "INT16": "INT16", "UINT16": "UINT16", "INT32": "INT32", "UINT32": "UINT32", "INT64": "INT64", "UINT64": "UINT64",
    "BOOL": "BOOL", "STRING": "STRING", "FLOAT8E4M3FN": "FP8", "FLOAT4E2M1": "FP4", "INT4": "INT4", "UINT4": "UINT4",
}


@dataclass(frozen=True)
class Finding:
    """One node TensorRT's ONNX parser would refuse (or parse only under a condition)."""

    node: str
    op: str
    problem: str


@cache
def support_data() -> dict[str, Any]:
    """The encoded operator list (see the module docstring)."""
    return json.loads(resources.files("pipeline.backend").joinpath(DATA_FILE).read_text())


def targets() -> tuple[str, ...]:
    """The TensorRT versions the data describes."""
    return tuple(support_data()["targets"])


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def check_onnx(model: Any, target: str | None = None) -> list[Finding]:
    """Every node of ``model`` (an ``onnx.ModelProto``) that TensorRT ``target`` (default: the
    data's default, 10.8) would not parse, or would parse only under a restriction it breaks."""
    import onnx

    data = support_data()
    target = target or data["default_target"]
    if target not in data["targets"]:
        raise PipelineError(f"no ONNX parser data for TensorRT {target}", f"use one of: {', '.join(data['targets'])}")
    version = _version(target)
    findings = []
    low, high = data["targets"][target]["opset"]
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and not low <= opset.version <= high:
            findings.append(Finding("(model)", "opset", f"opset {opset.version} is outside TensorRT {target}'s {low}..{high}"))
    functions = {(f.domain, f.name): f for f in model.functions}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # a model shape inference cannot follow is still checked, without types
        inferred = model
    types, ranks = _tensor_info(inferred.graph)
    constants = _constants(inferred.graph)
    for node in _expanded(_nodes(inferred.graph), functions, ()):
        findings.extend(_check_node(node, data["ops"], version, types, ranks, constants, target))
    return findings


def _expanded(nodes: Iterator[Any], functions: dict[tuple[str, str], Any], calling: tuple[tuple[str, str], ...]) -> Iterator[Any]:
    """``nodes`` with each call of a model-local function replaced by its body's nodes (recursively)."""
    for node in nodes:
        key = (node.domain, node.op_type)
        if key in functions and key not in calling:
            yield from _expanded(iter(functions[key].node), functions, (*calling, key))
        else:
            yield node


def summarize(findings: list[Finding]) -> list[str]:
    """One line per (op, problem): how many nodes and the first node's name."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for f in findings:
        grouped.setdefault((f.op, f.problem), []).append(f.node)
    return [
        f"{op}: {problem} ({len(nodes)} node{'s' if len(nodes) > 1 else ''}, e.g. '{nodes[0]}')"
        for (op, problem), nodes in grouped.items()
    ]


def op_counts(model: Any) -> Counter[str]:
    """How many nodes of each op type, subgraphs included (domain-qualified outside ONNX's own)."""
    return Counter(f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in _nodes(model.graph))


def _nodes(graph: Any) -> Iterator[Any]:
    import onnx

    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _nodes(sub)


def _tensor_info(graph: Any) -> tuple[dict[str, str], dict[str, int]]:
    """Element type (in the operator list's names) and rank of every tensor shape inference knows."""
    import onnx

    types: dict[str, str] = {}
    ranks: dict[str, int] = {}

    def visit(g: Any) -> None:
        for value in [*g.input, *g.output, *g.value_info]:
            tensor = value.type.tensor_type
            if value.type.HasField("tensor_type") and tensor.elem_type:
                types[value.name] = _TYPE_NAMES.get(onnx.TensorProto.DataType.Name(tensor.elem_type), "?")
                if tensor.HasField("shape"):
                    ranks[value.name] = len(tensor.shape.dim)
        for init in g.initializer:
            types[init.name] = _TYPE_NAMES.get(onnx.TensorProto.DataType.Name(init.data_type), "?")
            ranks[init.name] = len(init.dims)
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for sub in attr.graphs:
                        visit(sub)

    visit(graph)
    return types, ranks


def _constants(graph: Any) -> dict[str, Any]:
    """Initializers and Constant-node outputs, as numpy arrays (what the parser sees as constants)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    def value(tensor: Any) -> Any:
        if tensor.data_location == TensorProto.EXTERNAL:  # a weight in a data file (not loaded): its type and shape, no bytes
            return np.broadcast_to(np.zeros((), helper.tensor_dtype_to_np_dtype(tensor.data_type)), tuple(tensor.dims))
        return numpy_helper.to_array(tensor)

    values = {}
    for g in [graph]:
        for init in g.initializer:
            values[init.name] = value(init)
    for node in _nodes(graph):
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
        for attr in node.attribute:  # subgraph initializers
            if attr.type == attr.GRAPH:
                for init in attr.g.initializer:
                    values[init.name] = value(init)
    return values


def _check_node(
    node: Any, ops: dict, version: tuple[int, ...], types: dict[str, str], ranks: dict[str, int], constants: dict[str, Any], target: str
) -> Iterator[Finding]:
    name = node.name or f"{node.op_type}({', '.join(node.output)})"
    if node.domain not in ("", "ai.onnx"):
        yield Finding(name, f"{node.domain}::{node.op_type}", f"custom-domain op: TensorRT {target} needs a plugin for it")
        return
    rule = ops.get(node.op_type)
    if rule is None:
        yield Finding(name, node.op_type, f"not in onnx-tensorrt's operator list: TensorRT {target} cannot parse it without a plugin")
        return
    if rule.get("supported") is False:
        yield Finding(name, node.op_type, f"not supported by TensorRT's ONNX parser ({rule.get('note', 'listed as N')})")
        return
    if "since" in rule and version < _version(rule["since"]):
        yield Finding(name, node.op_type, f"parsed from TensorRT {rule['since']} on, not by {target}")
        return
    allowed = rule["types"]
    for since, wider in sorted(rule.get("types_since", {}).items(), key=lambda kv: _version(kv[0])):
        if version >= _version(since):
            allowed = wider
    typed = node.output if rule.get("type_of") == "output" else node.input
    tensor = typed[0] if typed else ""
    dtype = types.get(tensor)
    if dtype == "DOUBLE":
        dtype = "FP32"  # the parser casts DOUBLE down (see type_notes in the data)
    if dtype and dtype != "?" and dtype not in allowed:
        yield Finding(name, node.op_type, f"{dtype} is not among its types in TensorRT {target} ({', '.join(allowed)})")
    for check in rule.get("checks", []):
        if "until" in check and version >= _version(check["until"]):
            continue
        if _breaks(check, node, constants, ranks):
            yield Finding(name, node.op_type, check["text"])


def _attr(node: Any, name: str) -> Any:
    from onnx import helper

    for attr in node.attribute:
        if attr.name == name:
            value = helper.get_attribute_value(attr)
            return value.decode() if isinstance(value, bytes) else value
    return None


def _breaks(check: dict, node: Any, constants: dict[str, Any], ranks: dict[str, int]) -> bool:
    """Whether ``node`` breaks the encoded restriction ``check``."""
    kind = check["kind"]
    index = check.get("index", 0)
    given = index < len(node.input) and bool(node.input[index])
    if kind == "constant_input":
        return given and node.input[index] not in constants
    if kind == "constant_below":  # a computed value is TensorRT's to check at build time
        return given and node.input[index] in constants and int(constants[node.input[index]].max()) >= check["limit"]
    if kind == "zero_input":
        return given and node.input[index] in constants and bool((constants[node.input[index]] != 0).any())
    if kind == "false_input":
        return given and (node.input[index] not in constants or bool(constants[node.input[index]].any()))
    if kind == "attribute_equals":
        value = _attr(node, check["name"])
        return value is not None and value != check["value"]
    if kind == "attribute_in":
        value = _attr(node, check["name"])
        return (value if value is not None else check.get("default")) not in check["values"]
    if kind == "all_ones_attribute":
        value = _attr(node, check["name"])
        return bool(value) and any(v != 1 for v in value)
    if kind == "attribute_absent":
        return any(_attr(node, n) is not None for n in check["names"])
    if kind == "max_outputs":
        return sum(1 for o in node.output if o) > check["count"]
    if kind == "input_rank_in":  # unknown ranks pass: the parser decides
        return given and node.input[index] in ranks and ranks[node.input[index]] not in check["ranks"]
    if kind == "einsum_simple":
        equation = str(_attr(node, "equation") or "")
        inputs = equation.split("->")[0].replace(" ", "").split(",")
        return "..." in equation or any(len(set(term)) != len(term) for term in inputs)
    raise PipelineError(f"unknown check kind '{kind}' in {DATA_FILE}", "fix the data file")


def warn_unparsable(models: dict[str, Any], target: str | None = None) -> dict[str, list[str]]:
    """Check each ONNX file (``{variant: path}``) against TensorRT ``target``'s parser; log one
    warning per op problem, so a CPU-only build says what the GPU machine's engine stage would
    refuse. Returns ``{variant: problems}``."""
    import logging

    from pipeline.data.tensors import load_onnx

    log = logging.getLogger(__name__)
    target = target or support_data()["default_target"]
    found = {}
    for variant, path in models.items():
        problems = summarize(check_onnx(load_onnx(path, external_data=False), target))  # the rules read the graph, not the weights
        for problem in problems:
            log.warning("TensorRT %s's ONNX parser would not take the %s model: %s", target, variant, problem)
        found[variant] = problems
    return found


def version_gated(model: Any, target: str | None = None) -> list[Finding]:
    """The findings of ``target`` (default: the build minimum, 10.8) that the newest listed TensorRT does not have: the
    ops, types and restrictions onnx-tensorrt's CHANGELOG.md dates to a later release (``since``, ``types_since``,
    ``until`` in the data) and the opset range. These are the rules where a real parser of a newer release
    (TensorRT-RTX's, which the build checks with) is known to take what ``target`` refuses, so the build keeps them."""
    data = support_data()
    target = target or data["build_minimum"]
    newest = max(data["targets"], key=_version)
    later = {(f.node, f.op) for f in check_onnx(model, newest)}
    return [f for f in check_onnx(model, target) if (f.node, f.op) not in later]


def warn_version_gated(models: dict[str, Any], target: str | None = None) -> dict[str, list[str]]:
    """:func:`version_gated` for each ONNX file (``{variant: path}``), one warning per problem; ``{variant: problems}``."""
    import logging

    from pipeline.data.tensors import load_onnx

    log = logging.getLogger(__name__)
    target = target or support_data()["build_minimum"]
    found = {}
    for variant, path in models.items():
        problems = [f"TensorRT {target}: {p}" for p in summarize(version_gated(load_onnx(path, external_data=False), target))]
        for problem in problems:
            log.warning("the %s model needs a TensorRT newer than %s: %s", variant, target, problem)
        found[variant] = problems
    return found
