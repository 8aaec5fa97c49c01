"""Plans built where they run (``build --plans-at-deploy``): what the build records beside an ONNX variant
(profiles, the plan's config naming every profile, golden inputs/outputs in Polygraphy's JSON formats), the
deploy bundle's init step (compose one-shot service the server depends on; docker-run.sh runs it first), and the
init script itself, run by bash with a stand-in ``polygraphy`` on PATH (TensorRT and Docker cannot run here):
a plan whose golden check fails is not served, the others are."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from pipeline.accuracy.evaldata import EvalBucket, EvalData
from pipeline.build.publish import PublishSettings, repository_from_artifacts
from pipeline.core.errors import PipelineError
from pipeline.data.artifacts import Artifact
from pipeline.data.profiles import ShapeProfile
from pipeline.triton.config import parse_config
from pipeline.triton.deploy import write_deploy_bundle
from pipeline.triton.deploy_plans import DeployPlans, build_plans_script, plan_builds
from pipeline.triton.repository import read_repository

PROFILES = (ShapeProfile({"tokens": ((1, 4), (4, 8), (8, 16))}), ShapeProfile({"tokens": ((1, 16), (4, 32), (8, 64))}))


def _model(path: Path) -> Path:
    x = helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq"])
    y = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", "seq"])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["tokens"], ["scores"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _publish(tmp_path: Path) -> Path:
    onnx_path = _model(tmp_path / "model.fp16.onnx")
    rng = np.random.default_rng(3)
    data = EvalData(tuple(EvalBucket(f"{n}", {"tokens": rng.normal(size=(10, n)).astype(np.float32)}) for n in (6, 24)), "test", "f")
    settings = PublishSettings(model="tok", repository=tmp_path / "model_repository", max_batch=8, version_policy="new", labels=None,
                               classifier_output=None, mig=None, image=None,
                               deploy_plans=DeployPlans(PROFILES, True, 3, (("fp32", 1e-2), ("fp16", 2e-2), ("int8", 1e-2))))
    repository_from_artifacts([Artifact("fp16", "onnx", onnx_path)], {"fp16": onnx_path}, data.head(1), settings, {}, "test", golden=data)
    return settings.repository


def test_the_build_records_profiles_config_and_golden_data_beside_the_onnx_variant(tmp_path: Path) -> None:
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    repository = _publish(tmp_path)
    model = repository / "tok_fp16"
    assert sorted(p.relative_to(model / "plan").as_posix() for p in (model / "plan").rglob("*") if p.is_file()) == [
        "build.json", "config.pbtxt", "golden/profile0.inputs.json", "golden/profile0.outputs.json",
        "golden/profile1.inputs.json", "golden/profile1.outputs.json"]
    config = parse_config((model / "plan" / "config.pbtxt").read_text())
    assert (config.name, config.platform) == ("tok_fp16_trt", "tensorrt_plan")
    assert [list(g.profile) for g in config.instance_group] == [["0", "1"]] and not config.HasField("optimization")
    # Golden data: each bucket in the first profile admitting it; outputs are the ONNX model's own (Relu here).
    for index, length in ((0, 6), (1, 24)):
        feeds = load_json(model / "plan" / "golden" / f"profile{index}.inputs.json")
        results = RunResults.load(str(model / "plan" / "golden" / f"profile{index}.outputs.json"))
        [(_, iterations)] = list(results.items())
        assert [f["tokens"].shape for f in feeds] == [(8, length)]
        np.testing.assert_array_equal(iterations[0]["scores"], np.maximum(feeds[0]["tokens"], 0))
    [build] = plan_builds(repository, read_repository(repository))
    assert (build.plan_model, build.onnx_file, build.golden_profiles, build.atol, build.tf32) == ("tok_fp16_trt", "1/model.onnx", (0, 1), 2e-2, True)


def test_the_bundle_builds_the_plans_in_the_releases_tensorrt_container_before_the_server(tmp_path: Path) -> None:
    repository = _publish(tmp_path)
    bundle = tmp_path / "bundle"
    write_deploy_bundle(repository, bundle, image="nvcr.io/nvidia/tritonserver:25.01-py3")
    services = yaml.safe_load((bundle / "compose.yaml").read_text())["services"]
    plans, triton = services["plans"], services["triton"]
    assert plans["image"] == "nvcr.io/nvidia/tensorrt:25.01-py3" and plans["command"] == ["bash", "/build-plans.sh"]
    assert plans["restart"] == "no"
    assert triton["depends_on"] == {"plans": {"condition": "service_completed_successfully"}}
    assert {"type": "bind", "source": "./plans", "target": "/plans", "read_only": True} in triton["volumes"]
    assert {"type": "bind", "source": "./load-plans.py", "target": "/load-plans.py", "read_only": True} in triton["volumes"]
    command = triton["command"][2].replace("$$", "$")
    assert "--model-repository=/models" in command and "--model-repository=/plans" in command and "--load-model=tok_fp16 " in command
    # the plans are not loaded at start (one its TensorRT refused would stop the server): the loader loads them after
    assert "--strict-readiness=false" in command and "tok_fp16_trt" not in command and "{ python3 /load-plans.py /plans http://127.0.0.1:8000 || true; } & wait \"$pid\"" in command
    assert "& pid=$!; trap 'kill -TERM \"$pid\"' TERM INT;" in command and "exec " not in command.split("&& ", 1)[1]
    assert {"type": "bind", "source": "./wheels", "target": "/wheels", "read_only": True} in plans["volumes"]
    [wheel] = list((bundle / "wheels").iterdir())
    assert wheel.name.startswith("polygraphy-") and wheel.name.endswith("-none-any.whl")
    (bundle / "wheels" / "polygraphy-0.1.0-py3-none-any.whl").write_bytes(b"an older deploy's")  # two would conflict in pip
    write_deploy_bundle(repository, bundle, image="nvcr.io/nvidia/tritonserver:25.01-py3")
    assert [p.name for p in (bundle / "wheels").iterdir()] == [wheel.name]
    script = (bundle / "build-plans.sh").read_text()
    assert subprocess.run(["bash", "-n", str(bundle / "build-plans.sh")]).returncode == 0
    assert script.count("--trt-min-shapes") == 2 and "--strongly-typed" in script and "--tf32" in script
    assert "--optimization-profile 0" in script and "--optimization-profile 1" in script and "--load-outputs" in script
    run = (bundle / "docker-run.sh").read_text()
    assert subprocess.run(["bash", "-n", str(bundle / "docker-run.sh")]).returncode == 0
    assert run.index("nvcr.io/nvidia/tensorrt:25.01-py3 bash /build-plans.sh") < run.index("exec docker run")
    assert '-v "$PLANS_DIR:/plans:ro"' in run and '-v "$HERE/load-plans.py:/load-plans.py:ro"' in run and '-v "$HERE/wheels:/wheels:ro"' in run
    assert "python3 /load-plans.py /plans" in run
    with pytest.raises(PipelineError, match="not an NGC tritonserver -py3 tag, so the TensorRT container of its release is not known"):
        write_deploy_bundle(repository, tmp_path / "custom", image="registry.example/triton:prod")


STANDIN_POLYGRAPHY = """#!/usr/bin/env bash
# Stand-in for Polygraphy (TensorRT cannot run here): convert writes the plan file named by -o; run fails when
# the FAIL_PLAN environment variable names a path in its arguments.
if [ "$1" = convert ]; then
  while [ $# -gt 0 ]; do [ "$1" = -o ] && { echo plan > "$2"; exit 0; }; shift; done; exit 1
fi
case "$*" in *"${FAIL_PLAN:-never}"*) echo "FAILED: outputs differ"; exit 1;; esac
exit 0
"""


@pytest.mark.parametrize("fail", [None, "tok_fp16_trt"])
def test_the_init_script_serves_only_plans_that_pass_their_golden_check(tmp_path: Path, fail: str | None) -> None:
    repository = _publish(tmp_path)
    builds = plan_builds(repository, read_repository(repository))
    plans_dir = tmp_path / "plans"
    script = tmp_path / "build-plans.sh"
    script.write_text(build_plans_script(builds, models_dir=str(repository), plans_dir=str(plans_dir)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "polygraphy").write_text(STANDIN_POLYGRAPHY)
    (bin_dir / "polygraphy").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **({"FAIL_PLAN": fail} if fail else {})}
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr  # the server still starts with the models that work
    served = sorted(p.name for p in plans_dir.iterdir())
    if fail:
        assert served == [] and "plan tok_fp16_trt: not served" in run.stdout
    else:
        assert served == ["tok_fp16_trt"] and "plan tok_fp16_trt: built and checked, served" in run.stdout
        model = plans_dir / "tok_fp16_trt"
        assert (model / "1" / "model.plan").is_file() and parse_config((model / "config.pbtxt").read_text()).name == "tok_fp16_trt"
        assert (model / "warmup").is_dir()
    words = shlex.split(script.read_text().splitlines()[-3])  # the plan line: name, source, commands
    assert words[:2] == ["plan", "tok_fp16_trt"]


def test_the_golden_files_are_what_polygraphy_run_loads(tmp_path: Path) -> None:
    """The real ``polygraphy run --load-inputs --load-outputs`` (ONNX Runtime standing in for the plan: TensorRT
    cannot run here) passes on the variant itself and fails when a recorded output is off by more than atol."""
    import sys

    from polygraphy.comparator import RunResults

    repository = _publish(tmp_path)
    golden = repository / "tok_fp16" / "plan" / "golden"
    polygraphy = [str(Path(sys.executable).parent / "polygraphy")]
    argv = [*polygraphy, "run", str(repository / "tok_fp16" / "1" / "model.onnx"), "--onnxrt", "--load-inputs",
            str(golden / "profile1.inputs.json"), "--load-outputs", str(golden / "profile1.outputs.json"), "--atol", "0.02", "--rtol", "0"]
    assert subprocess.run(argv, capture_output=True, text=True).returncode == 0
    results = RunResults.load(str(golden / "profile1.outputs.json"))
    [(name, iterations)] = list(results.items())
    iterations[0]["scores"] = iterations[0]["scores"] + 0.5
    results.save(str(golden / "profile1.outputs.json"))
    failed = subprocess.run(argv, capture_output=True, text=True)
    assert failed.returncode != 0 and "FAILED" in failed.stdout + failed.stderr


def test_the_mig_bundle_says_it_does_not_build_plans_recorded_for_deploy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from pipeline.mig.bundle import write_bundle
    from pipeline.mig.memory import MemoryEstimate
    from pipeline.mig.plan import GIB, plan_instances
    from pipeline.mig.profiles import builtin_gpu

    repository = _publish(tmp_path)
    plan = plan_instances(builtin_gpu("H200-141GB"), {"tok_fp16": MemoryEstimate("hand-written", GIB, GIB)}, None)
    with caplog.at_level("WARNING"):
        write_bundle(tmp_path / "mig", plan, repository=repository)
    [line] = [r.getMessage() for r in caplog.records if "--plans-at-deploy" in r.getMessage()]
    assert "beside tok_fp16:" in line and "python -m pipeline deploy" in line
