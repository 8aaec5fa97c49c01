"""`build --fp16 --int8` through the TensorRT engine stage, its metadata, its gate and publishing.

TensorRT cannot run here (no GPU, no driver). The build half is real: the seam's build
(pipeline.backend.trt_compile.compile_plan: strongly typed network, profiles, optimization level,
workspace, TF32, timing cache) runs through TensorRT-RTX, which parses and compiles ahead of time
for compute capability 8.0 without a GPU. Only execution is the stand-in of tests/trt_standin.py
(it runs the plan's ONNX model with ONNX Runtime, refusing shapes outside the active profile),
given to the build through ``BuildConfig.tensorrt`` (nothing is patched). The command line is
parsed by the real parser; the model (tests.keras_models:tokens) has a dynamic sequence axis, the
build two profiles and ``--max-batch 8``, so the gate must batch at most 8 and run each length in
the profile that admits it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.backend.trt_rtx import rtx_version
from pipeline.cli import make_parser
from pipeline.commands.build import config_from_args, run_build
from pipeline.data.profiles import ShapeProfile, profiles_from_json
from pipeline.triton.config import parse_config
from tests.trt_standin import StandInTensorRT, real_builder

pytestmark = pytest.mark.slow

LENGTHS = (6, 12, 24, 48)  # 6 and 12 fit profile 0 (4..16), 24 and 48 profile 1 (16..64)
PROFILES = ("tokens:1x4/8x8/8x16", "tokens:1x16/4x32/8x64")


def _data(root: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(28)
    calib = {f"tokens__{n}": rng.integers(0, 100, (30, n)).astype(np.int32) for n in LENGTHS}
    evaluation = {f"tokens__{n}": rng.integers(0, 100, (20, n)).astype(np.int32) for n in LENGTHS}
    evaluation |= {f"labels__{n}": rng.integers(0, 4, 20) for n in LENGTHS}
    root.mkdir(parents=True)
    np.savez(root / "calib.npz", **calib)
    np.savez(root / "eval.npz", **evaluation)
    return root / "calib.npz", root / "eval.npz"


def _argv(tmp_path: Path, calib: Path, evaluation: Path, *extra: str) -> list[str]:
    return ["build", "--model", "tests.keras_models:tokens", "--name", "tokens", "--fp16", "--int8", "--no-int8-cpu", "--max-batch", "8",
            "--shape", PROFILES[0], "--shape", PROFILES[1], "--calibration", str(calib), "--eval-data", str(evaluation),
            "--calibration-root", str(tmp_path / "no-data"), "--workdir", str(tmp_path / "build"),
            "--repository", str(tmp_path / "model_repository"),
            "--fp16-max-drop", "100", "--int8-max-drop", "100", *extra]  # the gate's verdict is not what this test is about


def _config(argv: list[str], tensorrt: StandInTensorRT):  # type: ignore[no-untyped-def]
    args = make_parser().parse_args(argv)
    args.argv = argv
    return dataclasses.replace(config_from_args(args), tensorrt=tensorrt)


def test_build_fp16_int8_goes_through_the_engine_stage_to_the_repository(tmp_path: Path) -> None:
    calib, evaluation = _data(tmp_path / "data")
    standin = StandInTensorRT(builder=real_builder("8.0"))
    assert run_build(_config(_argv(tmp_path, calib, evaluation, "--workspace", "256"), standin)) == 0

    # The engine stage: one strongly typed build per GPU variant, both profiles, typed.
    expected = (ShapeProfile({"tokens": ((1, 4), (8, 8), (8, 16))}), ShapeProfile({"tokens": ((1, 16), (4, 32), (8, 64))}))
    assert [r.onnx_path.name for r in standin.requests] == ["model.fp32.onnx", "model.fp16.onnx", "model.int8.onnx"]
    assert all(r.profiles == expected and r.tf32 is True and r.hardware_compatibility == "NONE" and r.workspace_mib == 256
               for r in standin.requests)
    # What the real builder made: a strongly typed network of the graph's layers, with both profiles read back from
    # the builder's own profile objects; the first build starts the timing cache, the next two are given it.
    facts = [b.facts for b in standin.built]
    assert all(f.strongly_typed and f.layers and f.layers > 0 and f.profiles == expected for f in facts)
    assert all(f.workspace_bytes == 256 << 20 for f in facts)
    assert [f.timing_cache_loaded for f in facts] == [False, True, True]
    assert standin.built[2].facts.layers > standin.built[0].facts.layers  # the Q/DQ graph adds quantize/dequantize layers

    ws = tmp_path / "build" / "tokens"
    assert (ws / "engines" / "timing.cache").read_bytes() == standin.built[-1].timing_cache
    manifest = json.loads((ws / "manifest.json").read_text())
    stages = {s["name"]: s["status"] for s in manifest["stages"]}
    assert {stages[f"engine-{p}"] for p in ("fp32", "fp16", "int8")} == {"ran"}
    for precision, built in zip(("fp32", "fp16", "int8"), standin.built):
        plan = Path(manifest["artifacts"][f"{precision}.plan"])
        assert plan.read_bytes() == built.plan
        meta = json.loads(Path(str(plan) + ".json").read_text())
        assert meta["tensorrt_version"] == rtx_version() and meta["gpu"]["compute_capability"] == "8.0"
        assert (meta["hardware_compatibility"], meta["tf32"], meta["host_code_allowed"], meta["strongly_typed"]) == ("NONE", True, False, True)
        assert [p["tokens"]["max"] for p in meta["profiles"]] == [[8, 16], [8, 64]]
        assert meta["build_settings"]["workspace_mib"] == 256 and meta["build_settings"]["layers"] == built.facts.layers

    # The gate: batches of at most 8 (not EVAL_BATCH 64), each length run in the profile that admits it.
    report = json.loads((ws / "accuracy.json").read_text())
    assert report["batch_size"] == 8
    plans = {v["variant"]: v for v in report["variants"] if v["kind"] == "plan"}
    assert set(plans) == {"fp32-plan", "fp16-plan", "int8-plan"} and all(v["passed"] for v in plans.values())
    assert plans["fp32-plan"]["samples"] == 80
    gate_runners, latency_runners = standin.runners[:3], standin.runners[3:]
    for runner in gate_runners:
        assert sorted(set(runner.profile_log)) == [0, 1]  # 10 batches: lengths 6/12 in profile 0, 24/48 in profile 1

    # The latency stage times every plan through the seam (the stand-in's times are ONNX Runtime's on this CPU, no GPU's),
    # at batch 1 and at the largest batch its profiles admit, on the first evaluation sample (length 6: profile 0).
    latency = {v["variant"]: v for v in json.loads((ws / "latency.json").read_text())["variants"]}
    assert len(latency_runners) == 3 and all(set(r.profile_log) == {0} for r in latency_runners)
    for precision in ("fp32", "fp16", "int8"):
        plan, onnx = latency[f"{precision}-plan"], latency[f"{precision}-onnx"]
        meta = json.loads(Path(manifest["artifacts"][f"{precision}.plan"] + ".json").read_text())  # what built the plan says it is
        assert (plan["target"], plan["device"], plan["runtime"]) == ("gpu", meta["gpu"]["name"], f"TensorRT {meta['tensorrt_version']}")
        assert [b["batch"] for b in plan["batches"]] == [b["batch"] for b in onnx["batches"]] == [1, 8] and onnx["target"] == "cpu"

    # Published: plans with configs in the repository, serving every shape the gate ran: each is admitted by a
    # profile that instance_group names (Triton serves only profile 0 of a group that names none).
    gate_shapes = [shapes for runner in gate_runners for shapes in runner.shape_log]
    assert {shapes["tokens"][1] for shapes in gate_shapes} == set(LENGTHS)
    for precision in ("fp32", "fp16", "int8"):
        model = tmp_path / "model_repository" / f"tokens_{precision}_trt"
        assert (model / "1" / "model.plan").is_file()
        config = parse_config((model / "config.pbtxt").read_text())
        assert config.platform == "tensorrt_plan"
        named = [int(p) for group in config.instance_group for p in group.profile]
        assert named == [0, 1]
        profiles = profiles_from_json(json.loads(Path(manifest["artifacts"][f"{precision}.plan"] + ".json").read_text())["profiles"])
        for shapes in gate_shapes:
            assert any(all(all(lo <= d <= hi for d, lo, hi in zip(shape, *profiles[i].shapes[name][::2])) for name, shape in shapes.items())
                       for i in named), shapes


def test_engine_options_reach_the_seam_and_the_metadata(tmp_path: Path) -> None:
    """--hardware-compatible and --no-tf32 are built and recorded; the FP32 plan is held to --fp32-engine-atol."""
    calib, evaluation = _data(tmp_path / "data")
    standin = StandInTensorRT(builder=real_builder("8.6"))
    cfg = _config(_argv(tmp_path, calib, evaluation, "--hardware-compatible", "--no-tf32"), standin)
    assert (cfg.hardware_compatible, cfg.tf32, cfg.allow_plan_host_code) == (True, False, False)
    assert run_build(cfg) == 0
    assert {(r.hardware_compatibility, r.tf32) for r in standin.requests} == {("AMPERE_PLUS", False)}
    manifest = json.loads((tmp_path / "build" / "tokens" / "manifest.json").read_text())
    meta = json.loads(Path(manifest["artifacts"]["fp32.plan"] + ".json").read_text())
    assert (meta["hardware_compatibility"], meta["tf32"], meta["gpu"]["compute_capability"]) == ("AMPERE_PLUS", False, "8.6")
    assert meta["build_settings"]["workspace_mib"] is None and meta["build_settings"]["workspace_bytes"] is None
    report = json.loads((tmp_path / "build" / "tokens" / "accuracy.json").read_text())
    gate = next(v["gate"] for v in report["variants"] if v["variant"] == "fp32-plan")
    assert gate["atol"] == cfg.gates.fp32_engine_atol != cfg.gates.tf32_atol
