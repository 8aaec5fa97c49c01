"""The build report's variant rows: the latency stage on real ONNX Runtime sessions, the variants table
(accuracy, gate figure with its unit, size, latency per target and batch), what was published, the
notes (CPU INT8, variants left out), the chart, and stage times of the run that produced the artifacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from pipeline.accuracy.evaldata import EvalData
from pipeline.data.artifacts import Artifact
from pipeline.reports.build_tables import accuracy_data, figure_text, limit_text, stage_data, stage_seconds, stage_status, stage_total
from pipeline.reports.variant_chart import variant_chart_png
from pipeline.reports.variants import published_data, size_text, variant_notes, variant_rows, variants_data
from pipeline.stages.latency import latency_report_from_variants


def _softmax_model(path: Path) -> Path:
    """x (batch, 16) float → softmax(x @ W): a real model ONNX Runtime runs."""
    weights = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probs"], axis=1)],
                              "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 4])], [numpy_helper.from_array(weights, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _data() -> EvalData:
    x = np.random.default_rng(1).normal(size=(10, 16)).astype(np.float32)
    return EvalData.single({"x": x}, None, "eval.npz", "fp")


def test_the_latency_stage_times_each_variant_as_it_is_served_and_records_how(tmp_path: Path) -> None:
    model = _softmax_model(tmp_path / "model.fp32.onnx")
    variants = [Artifact("fp32", "onnx", model), Artifact("int8", "onnx", model), Artifact("int8cpu", "onnx", model)]
    report = latency_report_from_variants(variants, _data(), tmp_path / "latency.json", batches=[1, 8], threads=1, warmup=1, repeats=3)
    assert json.loads((tmp_path / "latency.json").read_text()) == report
    assert (report["threads"], report["repeats"], report["warmup"], report["statistic"]) == (1, 3, 1, "median")
    rows = {r["variant"]: r for r in report["variants"]}
    assert list(rows) == ["fp32-onnx", "int8-onnx", "int8cpu-onnx"]
    for row in rows.values():
        assert row["target"] == "cpu" and row["threads"] == 1 and row["bytes"] == model.stat().st_size
        assert [b["batch"] for b in row["batches"]] == [1, 8]
        assert all(b["min_ms"] <= b["median_ms"] <= b["max_ms"] and b["median_ms"] > 0 for b in row["batches"])
    # INT8 Q/DQ is served (and gated) with ORT's graph optimizations off; the CPU INT8 variant with them on.
    assert rows["int8-onnx"]["runtime"].endswith("graph optimizations off (exact Q/DQ)")
    assert rows["int8cpu-onnx"]["runtime"].endswith("graph optimizations on") and rows["fp32-onnx"]["runtime"].endswith("on")


def test_a_uint8_input_variant_is_fed_its_own_dtype(tmp_path: Path) -> None:
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "u8",
                              [helper.make_tensor_value_info("x", TensorProto.UINT8, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "u8.onnx"))
    report = latency_report_from_variants([Artifact("u8", "onnx", tmp_path / "u8.onnx")], _data(), tmp_path / "l.json",
                                          batches=[1, 4], threads=1, warmup=0, repeats=1)
    assert [b["batch"] for b in report["variants"][0]["batches"]] == [1, 4]  # ORT refuses a float feed for a uint8 input


def _gate(value: float, low: float, high: float, unit: str = "points", limit: float = 1.0) -> dict[str, Any]:
    return {"output": "probs", "kind": "classes", "metric": "accuracy drop (top-1)" if unit else "max abs error", "value": value,
            "low": low, "high": high, "unit": unit, "worse": "higher", "limit": limit, "verdict": "pass"}


def _manifest(tmp_path: Path, gpu: bool = False) -> dict[str, Any]:
    files = {}
    for precision, size in (("fp32", 117_191), ("fp16", 62_862), ("int8cpu", 50_499)):
        files[f"{precision}.onnx"] = tmp_path / f"model.{precision}.onnx"
        files[f"{precision}.onnx"].write_bytes(b"\0" * size)
    if gpu:
        files["fp16.plan"] = tmp_path / "fp16.plan"
        files["fp16.plan"].write_bytes(b"\0" * 2_000_000)

    def judged(variant: str, accuracy: float) -> dict[str, Any]:
        return {"variant": variant, "precision": variant.split("-")[0], "kind": variant.split("-")[1], "passed": True, "undecided": False,
                "accuracy": accuracy, "reference_accuracy": 0.9755, "agreement": 0.99, "gate": {"confidence": 0.95},
                "gates": [_gate(-0.22, -1.27, 0.75), _gate(0.0014, 0.0014, 0.0014, "", 0.01)]}

    variants = [judged("fp16-onnx", 0.9755), judged("int8cpu-onnx", 0.9777)] + ([judged("fp16-plan", 0.9733)] if gpu else [])
    latency = {"cpu": "Test CPU", "threads": 2, "warmup": 2, "repeats": 7, "statistic": "median", "measured_at": "2026-12-03T20:41:05+00:00",
               "variants": [{"variant": f"{p}-onnx", "precision": p, "kind": "onnx", "target": "cpu", "bytes": files[f"{p}.onnx"].stat().st_size,
                             "batches": [{"batch": 1, "median_ms": ms}, {"batch": 64, "median_ms": ms * 12}]}
                            for p, ms in (("fp32", 0.0455), ("fp16", 0.05), ("int8cpu", 0.083))]}
    if gpu:
        latency["variants"].append({"variant": "fp16-plan", "precision": "fp16", "kind": "plan", "target": "gpu", "device": "NVIDIA H200",
                                    "batches": [{"batch": 1, "median_ms": 0.02}, {"batch": 64, "median_ms": 0.04}]})
    return {"stages": [], "artifacts": {k: str(v) for k, v in files.items()},
            "results": {"accuracy": {"samples": 449, "data": "eval.npz", "labels": ["probs"], "variants": variants}, "latency": latency}}


def test_the_variants_table_shows_accuracy_size_and_latency_of_every_variant(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    rows = variant_rows(manifest, tmp_path)
    table = variants_data(rows, manifest["results"]["latency"])
    assert table.columns[-2:] == ["CPU ms, batch 1", "CPU ms, batch 64"] and not any("GPU" in c for c in table.columns)
    shown = {row[0]: row for row in table.rows}
    assert list(shown) == ["fp32-onnx", "fp16-onnx", "int8cpu-onnx"]
    assert shown["fp32-onnx"][1:5] == ["97.55%", "reference", "", "117 KB"]  # FP32's plain accuracy, from its reference figure
    assert table.columns[2] == "accuracy drop (top-1) vs FP32 (limit)"  # every variant's first figure: named once
    assert shown["int8cpu-onnx"][1:5] == ["97.77%", "-0.22 [-1.27, 0.75] pt (≤ 1 pt)", "pass", "50.5 KB"]
    assert shown["int8cpu-onnx"][5:] == ["0.083", "0.996"] and shown["fp32-onnx"][5:] == ["0.045", "0.546"]
    assert "Test CPU, 2 threads" in table.caption and "median of 7" in table.caption and "2026-12-03 20:41" in table.caption


def test_a_gpu_column_appears_only_with_a_gpu_measurement(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, gpu=True)
    table = variants_data(variant_rows(manifest, tmp_path), manifest["results"]["latency"])
    assert table.columns[-4:] == ["CPU ms, batch 1", "CPU ms, batch 64", "GPU ms, batch 1", "GPU ms, batch 64"]
    plan = next(row for row in table.rows if row[0] == "fp16-plan")
    assert plan[1] == "97.33%" and plan[4] == "2 MB" and plan[-4:] == ["—", "—", "0.020", "0.040"]
    assert "GPU: NVIDIA H200, TensorRT plans" in table.caption


def test_gate_figures_carry_their_unit_and_the_caption_says_what_the_bounds_are() -> None:
    assert (figure_text(_gate(0.0, -0.6, 0.6)), limit_text(_gate(0.0, -0.6, 0.6))) == ("0.00 [-0.60, 0.60] pt", "≤ 1 pt")
    assert (figure_text(_gate(0.0014, 0.0014, 0.0014, "", 0.01)), limit_text(_gate(0.0014, 0.0014, 0.0014, "", 0.01))) == ("0.0014", "≤ 0.01")
    report = {"samples": 449, "data": "eval.npz", "labels": ["probs"],
              "variants": [{"variant": "fp16-onnx", "gate": {"confidence": 0.95}, "gates": [_gate(0.0, -0.6, 0.6)]}]}
    table = accuracy_data(report)
    assert table.rows[0][4:6] == ["0.00 [-0.60, 0.60] pt", "≤ 1 pt"]
    assert table.caption.startswith("pt: percentage points; [low, high]: the figure's 95% confidence bounds")


@pytest.mark.parametrize(("results", "expected"), [
    ({}, []),
    ({"left_out": [{"variant": "int8cpu", "reason": "its gate failed: accuracy drop 3.1 pt > 1 pt"}]},
     ["left out: int8cpu: its gate failed: accuracy drop 3.1 pt > 1 pt"]),
    ({"left_out": [{"variant": "int8cpu"}, "fp16"]}, ["left out: int8cpu: no reason recorded", "left out: fp16"]),
    ({"left_out": "not a list"}, []),
])
def test_variants_left_out_get_one_line_each_whatever_the_manifest_holds(results: dict[str, Any], expected: list[str]) -> None:
    assert variant_notes([], results) == expected


def test_the_cpu_int8_variant_is_explained_where_it_appears(tmp_path: Path) -> None:
    rows = variant_rows(_manifest(tmp_path), tmp_path)
    [line] = variant_notes(rows, {})
    assert line.startswith("int8cpu: INT8 for CPU serving, run by ONNX Runtime's CPU integer kernels (uint8 activations")
    assert "--no-int8-cpu" in line
    assert variant_notes([r for r in rows if r.precision != "int8cpu"], {}) == []
    rows[1].precision = "int8"  # the Q/DQ INT8 variant: why its CPU latency is high
    assert variant_notes(rows, {})[0].startswith("int8: INT8 Q/DQ for TensorRT; ONNX Runtime serves it on a CPU with graph optimizations off")


def test_published_models_with_their_versions_and_where(tmp_path: Path) -> None:
    repository, build_dir = tmp_path / "repo", tmp_path / "digits"
    for model, versions in (("digits_fp32", [1]), ("digits_int8cpu", [1, 2])):
        for v in versions:
            (repository / model / str(v)).mkdir(parents=True)
    build_dir.mkdir()
    (build_dir / "published.json").write_text(json.dumps([str(repository / "digits_int8cpu" / "2")]))
    table = published_data(build_dir, {"artifacts": {"fp32.onnx": "a", "int8cpu.onnx": "b"}})
    assert table is not None and str(repository) in table.title
    assert table.rows == [["digits_fp32", "1", "—", str(repository / "digits_fp32")],
                          ["digits_int8cpu", "1, 2", "2", str(repository / "digits_int8cpu")]]
    assert published_data(tmp_path / "never-built", {"artifacts": {}}) is None


def test_the_chart_is_a_png_with_one_panel_per_latency_and_one_for_size(tmp_path: Path) -> None:
    rows = variant_rows(_manifest(tmp_path), tmp_path)
    png = variant_chart_png(rows, tmp_path / "chart.png", "build 'digits'")
    assert png == tmp_path / "chart.png"
    width, height = Image.open(png).size
    assert width > 2.5 * height  # three panels side by side and the legend
    unjudged = [r for r in rows if r.variant == "fp32-onnx"]
    unjudged[0].accuracy = unjudged[0].agreement = None
    assert variant_chart_png(unjudged, tmp_path / "none.png", "x") is None and not (tmp_path / "none.png").exists()


def test_stage_times_are_those_of_the_run_that_made_the_outputs() -> None:
    ran = {"name": "onnx", "status": "ran", "seconds": 14.891, "ran_seconds": 14.891, "ran_at": "2026-12-03T20:41:05+00:00"}
    skipped = {"name": "onnx", "status": "skipped", "seconds": 0.02, "ran_seconds": 14.891, "ran_at": "2026-12-03T20:41:05+00:00"}
    not_run = {"name": "engine", "status": "not run", "seconds": 0.0, "note": "no TensorRT"}
    assert (stage_status(ran), stage_seconds(ran)) == ("ran", "14.89")
    assert (stage_status(skipped), stage_seconds(skipped)) == ("skipped (ran 2026-12-03 20:41)", "14.89")
    assert (stage_status(not_run), stage_seconds(not_run)) == ("not run", "")
    old_skip = {"name": "onnx", "status": "skipped", "seconds": 0.02}  # a manifest from before the run was recorded
    assert stage_seconds(old_skip) == "—"
    assert stage_data({"stages": [ran, not_run]}, "t").rows == [["onnx", "ran", "14.89", ""], ["engine", "not run", "", "no TensorRT"]]
    assert stage_total({"stages": [ran, not_run]}) == "14.9 s of stages"
    assert stage_total({"stages": [skipped, not_run]}) == "14.9 s of stages when the artifacts were made · this build: 0.0 s"


def test_size_text() -> None:
    assert [size_text(n) for n in (None, 512, 43_594, 117_191, 4_200_000, 98_000_000_000)] == ["—", "512 B", "43.6 KB", "117 KB", "4.2 MB", "98 GB"]


def test_a_slow_model_gets_one_warm_up_call_and_stops_after_three_once_its_time_is_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from pipeline.stages import latency

    monkeypatch.setattr(latency, "POINT_BUDGET_S", 0.03)
    calls: list[int] = []

    def slow(feed: dict[str, np.ndarray]) -> None:
        calls.append(1)
        time.sleep(0.011)  # every call takes longer than the budget's share: 3 calls spend it

    point = latency._timed(slow, {}, 4, warmup=2, repeats=7)
    assert (len(calls), point["calls"], point["batch"]) == (1 + 3, 3, 4)
    calls.clear()
    monkeypatch.setattr(latency, "POINT_BUDGET_S", 1000.0)  # no stall of this machine reaches it
    fast = latency._timed(lambda feed: calls.append(1), {}, 1, warmup=2, repeats=7)
    assert (len(calls), fast["calls"]) == (2 + 7, 7)


def test_the_terminal_table_leaves_the_gate_figures_to_the_accuracy_table(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    table = variants_data(variant_rows(manifest, tmp_path), manifest["results"]["latency"], figures=False)
    assert table.columns == ["variant", "accuracy", "gate", "size", "CPU ms, batch 1", "CPU ms, batch 64"]
    assert table.rows[0] == ["fp32-onnx", "97.55%", "reference", "117 KB", "0.045", "0.546"]
    assert [table.right_aligned(i) for i in range(6)] == [False, True, False, True, True, True]


def test_the_accuracy_column_names_what_the_accuracy_is(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    for judged in manifest["results"]["accuracy"]["variants"]:
        judged["accuracy_metric"] = "R²"  # a regression output's accuracy is its R², which can be negative
    judged["accuracy"] = -0.0551
    table = variants_data(variant_rows(manifest, tmp_path), manifest["results"]["latency"], figures=False)
    assert table.columns[:2] == ["variant", "accuracy (R²)"]
    assert [row[1] for row in table.rows] == ["97.55%", "97.55%", "-5.51%"]
    judged["accuracy_metric"] = "top-1"  # two different metrics: no single name in the heading
    assert variants_data(variant_rows(manifest, tmp_path), figures=False).columns[1] == "accuracy"


def test_variants_judged_by_different_first_figures_name_theirs_in_the_cell(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    manifest["results"]["accuracy"]["variants"][1]["gates"] = [_gate(0.0014, 0.0014, 0.0014, "", 0.01)]
    table = variants_data(variant_rows(manifest, tmp_path), manifest["results"]["latency"])
    assert table.columns[2] == "gate figure vs FP32 (limit)"
    assert [row[2] for row in table.rows] == ["reference", "accuracy drop (top-1): -0.22 [-1.27, 0.75] pt (≤ 1 pt)", "max abs error: 0.0014 (≤ 0.01)"]
