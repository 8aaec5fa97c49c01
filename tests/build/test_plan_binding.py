"""Plans that know what they are bound to: refused in one line where they cannot load.

TensorRT cannot run here, so the TensorRT and GPU "at hand" are the stand-in's (tests/trt_standin.py),
passed to ``verify`` as its ``tensorrt``; the repositories are real folders with the build report a
published plan carries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.accuracy.gates import Gates
from pipeline.backend.plan_binding import PlanBinding, check_plan, same_tensorrt
from pipeline.backend.tensorrt_env import GpuInfo
from pipeline.build.publish import PublishSettings, check_repository_plans
from pipeline.core.errors import PipelineError
from pipeline.data.artifacts import Artifact
from pipeline.inspect.report import inspection_from_model
from pipeline.stages.engine import metadata_path
from pipeline.triton.verify import verify_repository
from tests.trt_standin import StandInTensorRT

H200 = GpuInfo("NVIDIA H200", (9, 0))
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", (8, 0))
T4 = GpuInfo("Tesla T4", (7, 5))


def meta(version: str = "10.16.1.11", cc: str = "9.0", level: str = "NONE") -> dict[str, Any]:
    return {"format": 1, "tensorrt_version": version, "gpu": {"index": 0, "name": "NVIDIA H200", "compute_capability": cc},
            "hardware_compatibility": level}


def plan_model(repository: Path, name: str, metadata: dict[str, Any] | None) -> Path:
    model = repository / name
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.plan").write_bytes(b"plan")
    (model / "config.pbtxt").write_text(f'name: "{name}"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n')
    (model / ".pipeline-report.json").write_text(json.dumps({"model": name, "versions": {"1": {"engine_metadata": metadata}}}))
    return model


@pytest.mark.parametrize("built, target, loads", [
    ("10.16.1.11", "10.16.1.11", True), ("10.16.1.11", "10.16", True), ("10.16.1.11", "10.16.1.12", False),
    ("10.16.1.11", "10.15", False), ("10.5", "10.50", False), ("10", "10.5", False),
])
def test_same_tensorrt_compares_as_many_parts_as_both_give(built: str, target: str, loads: bool) -> None:
    assert same_tensorrt(built, target) is loads


@pytest.mark.parametrize(
    "metadata, tensorrt, gpu, why",
    [
        (meta(), "10.8.0.43", None, "built with TensorRT 10.16.1.11 but there has TensorRT 10.8.0.43 (a plan loads only on the TensorRT that built it)"),
        (meta(), "10.16.2.3", None, "built with TensorRT 10.16.1.11 but there has TensorRT 10.16.2.3 (a plan loads only on the TensorRT that built it)"),
        (meta(), "11.4.0.106", None, "built with TensorRT 10.16.1.11 but there has TensorRT 11.4.0.106 (a plan loads only on the TensorRT that built it)"),
        (meta(), None, A100, "built for compute capability 9.0 (NVIDIA H200) but there has a GPU of compute capability 8.0"),
        (meta(level="AMPERE_PLUS"), None, T4, "built hardware-compatible (Ampere and newer) but there has a GPU of compute capability 7.5"),
    ],
)
def test_a_plan_is_refused_where_it_cannot_load(metadata: dict[str, Any], tensorrt: str | None, gpu: GpuInfo | None, why: str) -> None:
    with pytest.raises(PipelineError) as info:
        check_plan("m_fp16_trt", metadata, tensorrt_version=tensorrt, compute_capability=gpu and gpu.compute_capability, target="there")
    assert str(info.value.problem) == f"plan m_fp16_trt cannot load there: {why}"
    assert "\n" not in str(info.value)
    # --hardware-compatible helps only where the GPU differs: it does not make a plan load on another TensorRT
    assert ("--hardware-compatible" in str(info.value.fix)) == (gpu is A100)


@pytest.mark.parametrize(
    "metadata, tensorrt, gpu",
    [(meta(), "10.16.1.11", H200), (meta(), "10.16", H200), (meta(level="AMPERE_PLUS"), "10.16.1.11", A100), (meta(level="AMPERE_PLUS"), None, H200)],
)
def test_a_plan_loads_on_its_tensorrt_and_gpu(metadata: dict[str, Any], tensorrt: str | None, gpu: GpuInfo) -> None:
    check_plan("m", metadata, tensorrt_version=tensorrt, compute_capability=gpu.compute_capability, target="there")


def test_metadata_without_the_binding_is_refused() -> None:
    with pytest.raises(PipelineError, match="does not record the TensorRT version and GPU"):
        PlanBinding.of({"format": 1}, "the metadata of plan m")


def test_verify_refuses_a_plan_for_another_gpu_at_hand(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    plan_model(repository, "m_fp16_trt", meta())
    args: dict[str, Any] = {"url": None, "models": [], "calibration_root": tmp_path, "batch_size": 8, "atol": 1e-3, "gates": Gates(),
                            "report_path": tmp_path / "served.json", "workdir": tmp_path}
    with pytest.raises(PipelineError, match=r"plan m_fp16_trt cannot load there: built for compute capability 9.0 \(NVIDIA H200\) but "
                                            r"this machine \(TensorRT 10.16.1.11, NVIDIA A100-SXM4-80GB\) has a GPU of compute capability 8.0"):
        verify_repository(repository, tensorrt=StandInTensorRT(gpu=A100), **args)
    with pytest.raises(PipelineError, match="TensorRT 10.16.1.11 but this machine .* has TensorRT 11.4.0.106"):
        verify_repository(repository, tensorrt=StandInTensorRT(version="11.4.0.106"), **args)
    with pytest.raises(PipelineError, match="no servable pipeline ONNX model"):  # the plan passes; there is nothing else to verify
        verify_repository(repository, tensorrt=StandInTensorRT(gpu=H200), **args)


def test_publishing_refuses_plans_one_server_cannot_load_together(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    plan_model(repository, "other_fp16_trt", meta(version="10.8.0.43"))
    plan = tmp_path / "m.fp16.plan"
    plan.write_bytes(b"plan")
    metadata_path(plan).write_text(json.dumps(meta()))
    settings = PublishSettings("m", repository, 8, "new", None, None, None, None)
    with pytest.raises(PipelineError, match=r"plan other_fp16_trt cannot load there: built with TensorRT 10.8.0.43 but the server of "):
        check_repository_plans([Artifact("fp16", "plan", plan, metadata_path(plan))], settings)
    check_repository_plans([Artifact("fp16", "onnx", plan)], settings)  # no plan published: nothing to check


def test_inspect_reads_a_plan_through_the_seam_with_host_code_refused(tmp_path: Path) -> None:
    standin = StandInTensorRT()
    onnx_path = tmp_path / "m.onnx"
    from tests.stages.test_engine import tiny_onnx
    from pipeline.data.tensors import signature_from_onnx
    from pipeline.stages.engine import EngineSettings, engine_from_onnx
    from pipeline.stages.shapes import profiles_from_args

    tiny_onnx(onnx_path)
    profiles = tuple(profiles_from_args([], signature_from_onnx(onnx_path), max_batch=4))
    engine_from_onnx(onnx_path, tmp_path / "m.plan", settings=EngineSettings("fp32", profiles), timing_cache=tmp_path / "tc", tensorrt=standin)
    report = inspection_from_model(str(tmp_path / "m.plan"), tensorrt=standin)  # the stand-in refuses allow_host_code=True
    assert report.polygraphy == f"stand-in engine: {onnx_path}"
    assert report.notes == ["built with TensorRT 10.16.1.11 on NVIDIA H200 (stand-in) (compute capability 9.0): loads on that TensorRT "
                            "version and GPUs of compute capability 9.0 only; TF32 on"]  # what the plan is bound to, from its metadata


def test_the_mig_bundle_refuses_a_plan_built_for_another_gpu(tmp_path: Path) -> None:
    """mig-plan --repository --bundle for an A100 with a plan built on an H200: one line before any file is written;
    the same plan on the H200's table, or built hardware-compatible, is bundled."""
    from pipeline.mig.bundle import write_bundle
    from pipeline.mig.memory import MemoryEstimate
    from pipeline.mig.plan import GIB, plan_instances
    from pipeline.mig.profiles import builtin_gpu
    from pipeline.mig.servers import BundleSettings

    settings = BundleSettings(image="nvcr.io/nvidia/tritonserver:25.08-py3")
    memory = {"m_fp16_trt": MemoryEstimate("hand-written", GIB, GIB)}
    for level, gpu, refused in (("NONE", "A100-80GB", True), ("NONE", "H200-141GB", False), ("AMPERE_PLUS", "A100-80GB", False)):
        repository = tmp_path / f"{level}-{gpu}" / "repo"
        plan_model(repository, "m_fp16_trt", meta(level=level))
        plan = plan_instances(builtin_gpu(gpu), memory, None)
        out = repository.parent / "bundle"
        if refused:
            with pytest.raises(PipelineError, match=r"plan m_fp16_trt cannot load there: built for compute capability 9.0 \(NVIDIA H200\) "
                                                    r"but a MIG slice of A100-80GB has a GPU of compute capability 8.0"):
                write_bundle(out, plan, settings, repository=repository)
            assert not out.exists()
        else:
            # the GPU check passes; then the image's TensorRT, which no source gives, refuses the plan (tests/triton/test_deploy.py)
            with pytest.raises(PipelineError, match=r"the TensorRT of nvcr.io/nvidia/tritonserver:25.08-py3 is not known from a source"):
                write_bundle(out, plan, settings, repository=repository)
