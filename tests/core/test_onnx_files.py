"""An ONNX model with external data moves, copies, hashes and reruns as one unit (pipeline/core/onnx_files.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.core.fingerprint import hash_path
from pipeline.core.onnx_files import (atomic_onnx, copy_onnx, data_files, graph_proto, has_external_data, move_onnx, onnx_files, remove_onnx,
                                      save_onnx, tensor_bytes, total_size)
from pipeline.core.stagecache import Manifest, Stage, run_stage

TABLE = np.arange(300 * 16, dtype=np.float32).reshape(300, 16) / 100


def table_model() -> onnx.ModelProto:
    gather = helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)
    graph = helper.make_graph([gather], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [2, 16])], [numpy_helper.from_array(TABLE, "table")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def rows(path: Path) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": np.array([3, 299])})[0]


def test_a_model_saved_with_external_data_is_two_files_that_load_as_one(tmp_path: Path) -> None:
    path = save_onnx(table_model(), tmp_path / "m.onnx", external=True)
    assert data_files(path) == [tmp_path / "m.onnx.data"] and has_external_data(path)
    assert onnx_files(path) == [path, tmp_path / "m.onnx.data"]
    assert oct(os.stat(tmp_path / "m.onnx.data").st_mode & 0o777) == "0o644"  # a server in a container reads it as another user
    assert total_size(path) == path.stat().st_size + (tmp_path / "m.onnx.data").stat().st_size
    assert tensor_bytes(graph_proto(path)) == TABLE.nbytes  # counted from the data file's entries, not loaded
    np.testing.assert_array_equal(rows(path), TABLE[[3, 299]])
    save_onnx(table_model(), path, external=False)  # saved again in one file: the stale data file goes
    assert not has_external_data(path) and not (tmp_path / "m.onnx.data").exists()
    np.testing.assert_array_equal(rows(path), TABLE[[3, 299]])


def test_moved_and_copied_models_take_their_data_file_along_under_their_own_name(tmp_path: Path) -> None:
    src = save_onnx(table_model(), tmp_path / "a.onnx", external=True)
    (tmp_path / "sub").mkdir()
    copy = copy_onnx(src, tmp_path / "sub" / "b.onnx")
    assert data_files(copy) == [tmp_path / "sub" / "b.onnx.data"]
    np.testing.assert_array_equal(rows(copy), TABLE[[3, 299]])
    moved = move_onnx(src, tmp_path / "c.onnx")
    assert not src.exists() and not (tmp_path / "a.onnx.data").exists()
    assert data_files(moved) == [tmp_path / "c.onnx.data"]
    np.testing.assert_array_equal(rows(moved), TABLE[[3, 299]])
    remove_onnx(moved)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


def test_atomic_onnx_moves_graph_and_data_into_place_or_leaves_nothing(tmp_path: Path) -> None:
    dst = tmp_path / "m.onnx"
    with atomic_onnx(dst) as tmp:
        save_onnx(table_model(), tmp, external=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    np.testing.assert_array_equal(rows(dst), TABLE[[3, 299]])
    before = hash_path(dst)
    with pytest.raises(RuntimeError), atomic_onnx(dst) as tmp:
        save_onnx(table_model(), tmp, external=True)
        raise RuntimeError("killed halfway")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"] and hash_path(dst) == before


def test_the_hash_of_a_model_covers_its_data_file(tmp_path: Path) -> None:
    path = save_onnx(table_model(), tmp_path / "m.onnx", external=True)
    before = hash_path(path)
    data = tmp_path / "m.onnx.data"
    blob = bytearray(data.read_bytes())
    blob[100] ^= 1  # one weight changes, the graph file does not
    data.write_bytes(bytes(blob))
    assert hash_path(path) != before


def _write_model(dst: Path, scale: float) -> None:
    model = table_model()
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(TABLE * scale, "table"))
    with atomic_onnx(dst) as tmp:
        save_onnx(model, tmp, external=True)


def test_a_stage_whose_output_lost_its_data_file_runs_again(tmp_path: Path) -> None:
    manifest = Manifest(tmp_path / "manifest.json", "test", {})
    stage = Stage("table", _write_model, settings={"scale": 2.0}, outputs={"dst": tmp_path / "m.onnx"})
    assert run_stage(manifest, stage, "test") is True
    assert run_stage(manifest, stage, "test") is False  # graph and data file there: skipped
    (tmp_path / "m.onnx.data").unlink()
    assert run_stage(manifest, stage, "test") is True
    np.testing.assert_array_equal(rows(tmp_path / "m.onnx"), TABLE[[3, 299]] * 2)
