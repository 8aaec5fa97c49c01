"""Embedding tables quantized weights-only, per row (pipeline/stages/gather_tables.py), on real ONNX Runtime and
TensorRT-RTX's real builder (TensorRT's form is built, not run: no GPU here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from pipeline.backend.trt_rtx import RtxTensorRT
from pipeline.core.onnx_files import data_files, graph_proto, has_external_data, save_onnx, total_size
from pipeline.data.profiles import ShapeProfile
from pipeline.stages.engine import EngineSettings, engine_request
from pipeline.stages.gather_tables import large_tables, quantized_table, tables_for_tensorrt, tables_quantized
from pipeline.backend.trt_compile import ParseFailed
from pipeline.core.errors import PipelineError
from tests.stages.conftest import save_model, tensor

ROWS, COLS = 4000, 32
RNG = np.random.default_rng(3)
TABLE = (RNG.normal(0, 1, (ROWS, COLS)) * RNG.uniform(0.01, 5, (ROWS, 1))).astype(np.float32)  # rows of very different scales
TABLE[7] = 0.0  # a row of zeros has scale 1, not 0


def recommender_graph(path: Path, tied: bool = False) -> Path:
    """ids → Gather(table) → mean over the ids → MatMul: the table is 512 KB of the 516 KB of weights."""
    nodes = [onnx.helper.make_node("Gather", ["table", "ids"], ["rows"], name="lookup", axis=0),
             onnx.helper.make_node("ReduceMean", ["rows"], ["pooled"], axes=[1], keepdims=0),
             onnx.helper.make_node("MatMul", ["pooled", "w"], ["scores"])]
    weights = {"table": TABLE, "w": RNG.normal(0, 1, (COLS, 4)).astype(np.float32)}
    outputs = [tensor("scores", TensorProto.FLOAT, ["batch", 4])]
    if tied:  # the table is also read as a matrix: it is no Gather-only table
        nodes.append(onnx.helper.make_node("MatMul", ["pooled", "table_t"], ["logits"]))
        nodes.insert(0, onnx.helper.make_node("Transpose", ["table"], ["table_t"], perm=[1, 0]))
        outputs.append(tensor("logits", TensorProto.FLOAT, ["batch", ROWS]))
    return save_model(path, nodes, [tensor("ids", TensorProto.INT64, ["batch", 5])], outputs, weights)


def run(path: Path, ids: np.ndarray, optimized: bool = True) -> np.ndarray:
    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(["scores"], {"ids": ids})[0]


IDS = RNG.integers(0, ROWS, (64, 5)).astype(np.int64)
IDS[0, 0] = 7


def test_each_row_gets_its_own_scale_and_comes_back_within_half_a_step(tmp_path: Path) -> None:
    model = graph_proto(recommender_graph(tmp_path / "m.onnx"))
    init = next(i for i in model.graph.initializer if i.name == "table")
    q, scale = quantized_table(init, tmp_path, ROWS, COLS)
    assert q.dtype == np.int8 and scale.shape == (ROWS, 1)
    assert scale[7, 0] == 1.0 and not q[7].any()
    np.testing.assert_allclose(scale[:, 0][np.arange(ROWS) != 7], np.abs(TABLE).max(axis=1)[np.arange(ROWS) != 7] / 127, rtol=1e-6)
    assert np.all(np.abs(q.astype(np.float32) * scale - TABLE) <= scale / 2 + 1e-7)


def test_the_quantized_table_is_a_quarter_of_the_bytes_and_answers_as_its_rows_say(tmp_path: Path) -> None:
    path = recommender_graph(tmp_path / "m.onnx")
    reference, size = run(path, IDS), total_size(path)
    nodes = tables_quantized(path, path, min_bytes=100_000)
    assert set(nodes) == {"lookup", "lookup/dequantize", "lookup/row_scale", "lookup/scaled"}
    assert total_size(path) < 0.3 * size
    model = onnx.load(str(path))
    assert {i.name: i.data_type for i in model.graph.initializer}["table_int8"] == TensorProto.INT8
    q, scale = quantized_table(next(i for i in graph_proto(recommender_graph(tmp_path / "again.onnx")).graph.initializer if i.name == "table"),
                               tmp_path, ROWS, COLS)
    w = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w"))
    expected = ((q.astype(np.float32) * scale)[IDS].mean(axis=1)) @ w
    np.testing.assert_allclose(run(path, IDS), expected, rtol=1e-5, atol=1e-5)
    assert np.abs(run(path, IDS) - reference).max() < 0.02 * np.abs(reference).max()


def test_tensorrts_form_computes_the_same_values_and_tensorrt_rtx_builds_it(tmp_path: Path) -> None:
    path = recommender_graph(tmp_path / "m.onnx")
    tables_quantized(path, path, min_bytes=100_000)
    ours = run(path, IDS)
    model = onnx.load(str(path))
    assert tables_for_tensorrt(model) == 1
    trt_form = save_onnx(model, tmp_path / "trt.onnx", external=False)
    ops = [n.op_type for n in onnx.load(str(trt_form)).graph.node]
    assert ops.count("DequantizeLinear") == 1 and "Cast" not in ops and ops.count("Gather") == 1
    np.testing.assert_array_equal(run(trt_form, IDS, optimized=False), ours)  # the same multiply per element: bit-identical
    available, reason = RtxTensorRT("8.9").status()
    if not available:
        pytest.skip(reason)
    settings = EngineSettings(precision="int8", profiles=(ShapeProfile({"ids": ((1, 5), (8, 5), (64, 5))}),))
    assert RtxTensorRT("8.9").build(engine_request(trt_form, settings, timing_cache=None)).plan
    with pytest.raises((ParseFailed, PipelineError), match="only allowed before DQ"):  # why ONNX Runtime's form is not TensorRT's
        RtxTensorRT("8.9").build(engine_request(path, settings, timing_cache=None))


def test_only_large_tables_that_nothing_but_a_gather_reads_are_quantized(tmp_path: Path) -> None:
    path = recommender_graph(tmp_path / "m.onnx")
    assert [t.initializer for t in large_tables(graph_proto(path), 100_000)] == ["table"]
    assert large_tables(graph_proto(path), 1_000_000) == []  # below the size: left float
    tied = recommender_graph(tmp_path / "tied.onnx", tied=True)
    assert large_tables(graph_proto(tied), 100_000) == [] and tables_quantized(tied, tmp_path / "out.onnx", 100_000) == []
    assert not (tmp_path / "out.onnx").exists()


def test_a_table_in_a_data_file_is_quantized_from_it_and_the_model_keeps_a_data_file(tmp_path: Path) -> None:
    path = recommender_graph(tmp_path / "m.onnx")
    reference = run(path, IDS)
    save_onnx(onnx.load(str(path)), path, external=True)
    source = (path.read_bytes(), (tmp_path / "m.onnx.data").read_bytes())
    out = tmp_path / "q.onnx"
    tables_quantized(path, out, min_bytes=100_000)
    assert has_external_data(out) and data_files(out) == [tmp_path / "q.onnx.data"]
    assert np.abs(run(out, IDS) - reference).max() < 0.02 * np.abs(reference).max()
    assert (path.read_bytes(), (tmp_path / "m.onnx.data").read_bytes()) == source  # the source is read, never changed
