"""Models past ONNX's 2 GB limit: every variant keeps its weights in a data file beside its graph, from export to the
served repository; embedding tables are quantized weights-only, per row. Real TensorFlow, tf2onnx, ONNX Runtime,
TensorRT-RTX's builder and the embedded Triton.

``--external-data`` gives a small recommender (tests/big_models.py) the same files a 2 GB one gets, so every stage's
handling is checked in seconds; the slow test builds a 2.2 GB model, over the limit, the same way."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import onnx
import pytest

from pipeline.core.onnx_files import data_files, save_onnx, total_size
from tests.big_models import SMALL_DIM, SMALL_ROWS, rows_for, write_data
from tests.conftest import cli

VARIANTS = ("fp32", "fp16", "int8", "int8cpu")


def _build(tmp_path: Path, model: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("build", "--model", f"tests.big_models:{model}", "--name", "items", "--workdir", str(tmp_path / "w"),
               "--repository", str(tmp_path / "repo"), "--calibration", str(tmp_path / "data" / "calib.npz"),
               "--eval-data", str(tmp_path / "data" / "eval.npz"), "--fp16", "--int8", *extra, timeout=3000)


def _published(tmp_path: Path) -> dict[str, Path]:
    return {v: tmp_path / "repo" / f"items_{v}" / "1" / "model.onnx" for v in VARIANTS}


def _check_published(tmp_path: Path, manifest: dict) -> None:
    """Each variant is published as model.onnx + model.onnx.data; the INT8 ones hold the table in a quarter of the bytes;
    every gate passed, and so did the served check through the embedded Triton."""
    published = _published(tmp_path)
    for variant, model in published.items():
        assert data_files(model) == [model.parent / "model.onnx.data"], variant
        assert sorted(p.name for p in model.parent.iterdir()) == ["model.onnx", "model.onnx.data"]
    fp32 = total_size(published["fp32"])
    assert total_size(published["fp16"]) < 0.55 * fp32
    assert total_size(published["int8"]) <= 0.3 * fp32 and total_size(published["int8cpu"]) <= 0.3 * fp32
    int8 = onnx.load(str(published["int8"]), load_external_data=False)
    dq = [n for n in int8.graph.node if n.op_type == "DequantizeLinear" and n.input[0].endswith("_int8")]
    assert len(dq) == 1 and any(n.op_type == "Gather" and n.input[0] == dq[0].output[0] for n in int8.graph.node)  # TensorRT's form
    cpu = onnx.load(str(published["int8cpu"]), load_external_data=False)
    assert any(n.op_type == "Cast" and n.name.endswith("/dequantize") for n in cpu.graph.node)  # ONNX Runtime's: rows converted as read
    verdicts = {v["precision"]: v for v in manifest["results"]["accuracy"]["variants"]}
    assert all(verdicts[v]["passed"] for v in VARIANTS[1:]), verdicts
    served = manifest["results"]["served"]
    assert {m["model"]: m["passed"] for m in served["models"]} == {f"items_{v}": True for v in VARIANTS}, served
    sizes = {row["precision"]: row["bytes"] for row in manifest["results"]["latency"]["variants"] if row["kind"] == "onnx"}
    assert sizes["fp32"] == total_size(tmp_path / "w" / "items" / "model.fp32.onnx")  # the report's size counts the data file


def test_external_data_goes_through_every_stage_to_the_served_repository(tmp_path: Path) -> None:
    write_data(tmp_path / "data", SMALL_ROWS, dim=SMALL_DIM)
    proc = _build(tmp_path, "recommender_small", "--external-data", "--int8-table-min-mib", "0.1", "--verify-served")
    assert proc.returncode == 0, proc.stderr[-4000:]
    workdir = tmp_path / "w" / "items"
    manifest = json.loads((workdir / "manifest.json").read_text())
    _check_published(tmp_path, manifest)
    assert json.loads((workdir / "trt_check.json").read_text())["variants"]["int8"]["built"]  # TensorRT-RTX parsed it from the file

    again = _build(tmp_path, "recommender_small", "--external-data", "--int8-table-min-mib", "0.1")
    assert again.returncode == 0, again.stderr[-3000:]
    stages = {s["name"]: s["status"] for s in json.loads((workdir / "manifest.json").read_text())["stages"]}
    assert {stages[s] for s in ("onnx", "parity", "fp16", "int8", "int8cpu", "accuracy")} == {"skipped"}, stages

    (workdir / "model.fp32.onnx.data").unlink()  # a data file gone: its model is made again, and what it feeds
    third = _build(tmp_path, "recommender_small", "--external-data", "--int8-table-min-mib", "0.1")
    assert third.returncode == 0, third.stderr[-3000:]
    stages = {s["name"]: s["status"] for s in json.loads((workdir / "manifest.json").read_text())["stages"]}
    assert stages["onnx"] == "ran" and stages["fp16"] == "skipped"  # the same bytes again: the rest is unchanged


def _with_sparse_data_file(model: Path, size: int) -> None:
    """Give the (empty) model at ``model`` a tensor in ``<model>.data``, a sparse file of ``size`` bytes: as large as
    that to every size check, and no space taken on the disk."""
    graph = onnx.load(str(model))
    table = onnx.helper.make_tensor("table", onnx.TensorProto.FLOAT, [1, 1], [0.0])
    table.data_location = onnx.TensorProto.EXTERNAL
    table.external_data.add(key="location", value=f"{model.name}.data")
    graph.graph.initializer.append(table)
    onnx.save_model(graph, str(model))
    with open(model.parent / f"{model.name}.data", "wb") as fh:
        fh.truncate(size)


def test_the_disk_a_build_still_needs_is_said_after_the_export_when_it_is_short(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The rest of a build writes every variant in the workspace and again in a local repository: 3 × the FP32 model with
    FP16 and both INT8 variants (6.3 GB measured after a 2.2 GB export). A model whose (sparse) data file is larger than
    the disk's free space gets one line saying so, before any stage runs it."""
    import logging
    import shutil

    from pipeline.build.config import BuildConfig
    from pipeline.build.support import disk_need, note_needs
    from pipeline.core.objectstore import S3Url

    assert disk_need(2 * 10**9, ("fp32", "fp16", "int8", "int8cpu"), local_repository=True) == 6 * 10**9
    assert disk_need(2 * 10**9, ("fp32", "fp16", "int8", "int8cpu"), local_repository=False) == 2 * 10**9  # the workspace's variants
    model = tmp_path / "model.fp32.onnx"
    save_onnx(onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [])), model)
    cfg = BuildConfig(fp16=True, int8=True, repository=tmp_path / "repo")
    with caplog.at_level(logging.WARNING, logger="pipeline.build.support"):
        note_needs(model, cfg)
        assert not caplog.records  # a small model: nothing said
        free = shutil.disk_usage(tmp_path).free
        _with_sparse_data_file(model, free)  # as large as the free space, and it takes none of it
        note_needs(model, cfg)
        note_needs(model, BuildConfig(fp16=True, int8=True, repository=S3Url("bucket", "repo")))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("free: free space, or choose --workdir and --repository on a larger disk" in line for line in lines)
    assert f"writes about {3 * free / 2**30:.1f} GiB" in lines[0] and f"writes about {free / 2**30:.1f} GiB" in lines[1]


def test_a_stage_in_its_own_process_sizes_its_batches_to_the_budget_less_the_build_process(tmp_path: Path) -> None:
    """The budget is for the build, every process together: once stages run in children (64 MiB of FP32 model),
    the build process's 0.5 GiB comes off what a stage sizes its batches to (never more than half the budget)."""
    from pipeline.build.support import stage_budget_gib

    model = tmp_path / "model.fp32.onnx"
    save_onnx(onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [])), model)
    assert stage_budget_gib(model, 2.0) == 2.0  # a small model: stages run in the build process
    _with_sparse_data_file(model, 64 << 20)
    assert stage_budget_gib(model, 2.0) == 1.5 and stage_budget_gib(model, 0.8) == 0.4


@pytest.mark.slow
def test_a_model_over_2gb_builds_publishes_and_serves_every_variant(gigabytes_on_disk: None, tmp_path: Path) -> None:
    """2.2 GB of weights (an Embedding(537109, 1024) table): over protobuf's 2**31 bytes, in CI's time and memory."""
    write_data(tmp_path / "data", rows_for(2.2))
    proc = _build(tmp_path, "recommender_2g2", "--verify-served")
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((tmp_path / "w" / "items" / "manifest.json").read_text())
    _check_published(tmp_path, manifest)
    assert total_size(_published(tmp_path)["fp32"]) > 2**31  # past the limit a single ONNX file can hold
