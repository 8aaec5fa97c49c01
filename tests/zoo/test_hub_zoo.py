"""The keras-hub zoo end to end (tests/zoo/hub.py): each backbone builds FP32 + FP16 + INT8 from its
generated data, passes parity and its gates, is served by the embedded tritonserver and verified;
text models keep their sequence axis dynamic, with profiles and Triton dims from the data's length
buckets, and their integer inputs are never cast to float16 or quantized by the precision stages.

Slow (each builds and serves a real model; docs/keras-hub.md has the times). Needs keras-hub
(the ``hub`` extra, installed by scripts/setup.sh).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx
import pytest

from tests.zoo.harness import PRECISIONS, assert_tensorrt_built, build_zoo_model, serve_zoo_model
from tests.zoo.hub import HUB_ZOO, TRANSFORMERS
from tests.zoo.models import SEQ_LENGTHS

INTEGER = (onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.BOOL)
FLOAT16 = onnx.TensorProto.FLOAT16


def integer_input_uses(path: Path) -> dict[str, list[str]]:
    """For each integer graph input, what the precision stages could have done to it: every Cast to
    float16 and every QuantizeLinear reading it while it is still an integer (through Reshape,
    Unsqueeze, Squeeze, Expand, Identity and Casts between integer types), as ``op(node)`` strings.
    The model's own Cast to float32 (a mask made a multiplier) ends the integer value."""
    model = onnx.load(str(path))
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found: dict[str, list[str]] = {}
    for graph_input in model.graph.input:
        if graph_input.type.tensor_type.elem_type not in INTEGER:
            continue
        hits: list[str] = []
        frontier, seen = [graph_input.name], set()
        while frontier:
            tensor = frontier.pop()
            for node in consumers.get(tensor, []):
                if node.name in seen:
                    continue
                seen.add(node.name)
                to = next((a.i for a in node.attribute if a.name == "to"), None)
                if node.op_type == "QuantizeLinear" or (node.op_type == "Cast" and to == FLOAT16):
                    hits.append(f"{node.op_type}({node.name})")
                if node.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Expand", "Identity") or (node.op_type == "Cast" and to in INTEGER):
                    frontier.extend(node.output)
        found[graph_input.name] = hits
    return found


def test_integer_input_uses_finds_casts_to_float16_and_quantization(tmp_path: Path) -> None:
    from onnx import helper

    nodes = [
        helper.make_node("Unsqueeze", ["ids", "axes"], ["u"], name="unsq"),
        helper.make_node("Cast", ["u"], ["h"], name="to_half", to=FLOAT16),
        helper.make_node("Cast", ["mask"], ["m32"], name="to_int32", to=onnx.TensorProto.INT32),
        helper.make_node("QuantizeLinear", ["m32", "s"], ["q"], name="quant"),
        helper.make_node("Cast", ["mask"], ["f"], name="to_float", to=onnx.TensorProto.FLOAT),  # the model's own: ends the integer
        helper.make_node("Cast", ["f"], ["f16"], name="down", to=FLOAT16),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT32, [2, 3]),
                                            helper.make_tensor_value_info("mask", onnx.TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in ("h", "q", "f16")],
                              [helper.make_tensor("axes", onnx.TensorProto.INT64, [1], [2]), helper.make_tensor("s", onnx.TensorProto.FLOAT, [], [0.1])])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    assert integer_input_uses(tmp_path / "m.onnx") == {"ids": ["Cast(to_half)"], "mask": ["QuantizeLinear(quant)"]}


def dq_consumers(path: Path) -> Counter[str]:
    """How many DequantizeLinear outputs each op type reads: where the Q/DQ pairs sit."""
    model = onnx.load(str(path))
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return Counter(n.op_type for n in model.graph.node for name in n.input if name in dequantized)


# About 2.5 minutes each on 2 cores (docs/keras-hub.md); all of them run in CI's slow set.
@pytest.mark.slow
@pytest.mark.parametrize("name", HUB_ZOO)
def test_hub_model_builds_gates_serves_and_verifies(name: str, tmp_path: Path) -> None:
    pytest.importorskip("keras_hub", reason="keras-hub (the 'hub' extra) is not installed")
    entry = HUB_ZOO[name]
    run = build_zoo_model(entry, tmp_path)
    summary = json.dumps(run.as_json(), indent=1)[:4000]
    assert run.build_error is None, summary
    assert run.parity_passed, summary
    assert set(run.sizes) == set(PRECISIONS), summary
    assert_tensorrt_built(run, summary)  # the real builder built every GPU variant
    assert {p: g["passed"] for p, g in run.gates.items()} == {"fp16": True, "int8": True, "int8cpu": True}, summary
    assert run.figures == [], summary  # decided with room, and the CPU INT8 as close to FP32 as the INT8 graph
    ws = tmp_path / "build" / name
    if entry.sequence:
        inputs = sorted(run.config_dims)
        assert all(dims == [-1] for dims in run.config_dims.values()), summary  # the sequence axis stays dynamic in Triton
        # lengths 16 (80% of samples) and 20: OPT 16, MIN 16, MAX 32 (the next power of two above 20), for every input
        assert run.profiles == [" ".join(f"{i}:1x16/64x16/64x32" for i in inputs)], summary
        for precision in ("fp16", "int8", "int8cpu"):
            uses = integer_input_uses(ws / f"model.{precision}.onnx")
            assert set(uses) == set(inputs) and not any(uses.values()), (precision, uses)
    if name in TRANSFORMERS:
        # docs/keras-hub.md, INT8: Q/DQ only on the inputs of the projections, the MLP, the attention
        # MatMuls (Q·Kᵀ and weights·V: both inputs) and ViT's patch-embedding Conv; LayerNorm, Softmax,
        # GELU and residual Adds stay float.
        consumers = dq_consumers(ws / "model.int8.onnx")
        kept = {k["op_type"] for k in json.loads((ws / "int8.fallback.json").read_text())["kept"]}  # what the fallback left float
        assert {"MatMul"} <= set(consumers) <= {"Gemm", "MatMul", "Conv"} and consumers["Conv"] <= 2, consumers
        assert "Gemm" in consumers or "Gemm" in kept, (consumers, kept)

    serve_zoo_model(entry, tmp_path, run)
    summary = json.dumps(run.as_json(), indent=1)[:4000]
    assert run.served_error is None, summary
    assert {r["model"] for r in run.served if r["passed"]} == {f"{name}_{p}" for p in PRECISIONS}, summary
    if entry.sequence:
        assert set(run.per_length) == {f"{name}_{p}@{n}" for p in PRECISIONS for n in SEQ_LENGTHS}, summary
        assert max(run.per_length.values()) <= 1e-5, summary
