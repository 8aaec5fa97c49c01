"""The TensorRT engine stage where TensorRT cannot run: status line, clear errors, metadata, typing.

This machine has no TensorRT and no GPU, so nothing here builds an engine. The status and error
tests run for real; two subprocess tests put a fake ``tensorrt`` package on the path (said so in
their docstrings) to reach the checks that follow a successful import.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pipeline.backend import tensorrt_env
from pipeline.backend.plan_runner import runner_for_plan
from pipeline.backend.tensorrt_env import GpuInfo, tensorrt_status
from pipeline.backend.trt_seam import PolygraphyTensorRT
from pipeline.core.errors import PipelineError
from pipeline.data.profiles import ShapeProfile
from pipeline.data.tensors import signature_from_onnx
from pipeline.stages.engine import (
    EngineSettings,
    IOTensor,
    engine_from_onnx,
    engine_metadata,
    metadata_path,
    read_engine_metadata,
    write_engine_metadata,
)
from pipeline.stages.shapes import profiles_from_args

ROOT = Path(__file__).resolve().parents[2]
NO_TENSORRT = importlib.util.find_spec("tensorrt") is None
HAS_GPU = isinstance(tensorrt_env._probe_gpu(), GpuInfo)


def tiny_onnx(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["image"], ["probs"])],
        "digits_like",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 8, 8, 1])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 8, 8, 1])],
    )
    onnx.save(helper.make_model(graph), str(path))
    return path


def run_python(code: str, extra_path: Path) -> Any:
    """Run ``code`` in a fresh interpreter with ``extra_path`` first on sys.path; its last line is JSON."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(extra_path), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not NO_TENSORRT, reason="tensorrt is installed here")
def test_status_without_tensorrt_is_one_line_naming_the_install() -> None:
    ok, reason = tensorrt_status()
    assert ok is False
    assert reason == (
        "TensorRT engine step not run: the Python module 'tensorrt' is not installed "
        "(pip install --extra-index-url https://pypi.nvidia.com '.[tensorrt]' on a machine with an NVIDIA GPU); "
        "building ONNX variants only"
    )


@pytest.mark.skipif(not NO_TENSORRT, reason="tensorrt is installed here")
def test_engine_from_onnx_without_tensorrt_raises_and_writes_nothing(tmp_path: Path) -> None:
    onnx_path = tiny_onnx(tmp_path / "m.onnx")
    profiles = profiles_from_args([], signature_from_onnx(onnx_path), max_batch=8)
    plan = tmp_path / "out" / "m_fp32.plan"
    with pytest.raises(PipelineError) as info:
        engine_from_onnx(onnx_path, plan, settings=EngineSettings("fp32", tuple(profiles)), timing_cache=tmp_path / "tc.bin",
                         tensorrt=PolygraphyTensorRT())
    assert info.value.problem == "the TensorRT engine step cannot run: the Python module 'tensorrt' is not installed"
    assert info.value.fix is not None and "https://pypi.nvidia.com" in info.value.fix
    assert not (tmp_path / "out").exists() and not (tmp_path / "tc.bin").exists()


@pytest.mark.skipif(not NO_TENSORRT, reason="tensorrt is installed here")
def test_runner_for_plan_without_tensorrt(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"plan .*missing\.plan does not exist"):
        runner_for_plan(tmp_path / "missing.plan", {}, tensorrt=PolygraphyTensorRT())
    (tmp_path / "m.plan").write_bytes(b"not a plan")
    with pytest.raises(PipelineError, match="'tensorrt' is not installed"):
        runner_for_plan(tmp_path / "m.plan", {}, tensorrt=PolygraphyTensorRT())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"precision": "bf16"}, "unknown precision 'bf16'"),
        ({"optimization_level": 6}, "optimization level must be 0..5, got 6"),
        ({"workspace_mib": 0}, "workspace limit must be at least 1 MiB, got 0"),
    ],
)
def test_build_arguments_are_checked_before_tensorrt(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    onnx_path = tiny_onnx(tmp_path / "m.onnx")
    settings = EngineSettings(**({"precision": "fp16", "profiles": ()} | kwargs))  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match=message):
        engine_from_onnx(onnx_path, tmp_path / "m.plan", settings=settings, timing_cache=tmp_path / "tc", tensorrt=PolygraphyTensorRT())
    with pytest.raises(PipelineError, match="does not exist"):
        engine_from_onnx(tmp_path / "nope.onnx", tmp_path / "m.plan", settings=EngineSettings("fp16", ()), timing_cache=tmp_path / "tc",
                         tensorrt=PolygraphyTensorRT())


def test_stub_only_tensorrt_package_is_detected(tmp_path: Path) -> None:
    """No mock: a folder ``tensorrt/`` holding only ``__init__.pyi`` (what tensorrt-stubs installs)."""
    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.pyi").write_text("class Builder: ...\n__version__: str\n")
    onnx_path = tiny_onnx(tmp_path / "m.onnx")
    result = run_python(
        f"""
        import json, tensorrt
        from pipeline.core.errors import PipelineError
        from pipeline.stages.engine import EngineSettings, engine_from_onnx
        from pipeline.backend.tensorrt_env import tensorrt_status
        from pipeline.backend.trt_seam import PolygraphyTensorRT
        try:
            engine_from_onnx({str(onnx_path)!r}, {str(tmp_path / 'm.plan')!r}, settings=EngineSettings("fp32", ()),
                             timing_cache={str(tmp_path / 'tc')!r}, tensorrt=PolygraphyTensorRT())
            error = None
        except PipelineError as exc:
            error = str(exc)
        print(json.dumps({{"has_builder": hasattr(tensorrt, "Builder"), "status": tensorrt_status(), "error": error}}))
        """,
        tmp_path,
    )
    assert result["has_builder"] is False  # `import tensorrt` succeeded: that is the trap
    ok, reason = result["status"]
    assert ok is False
    assert f"the 'tensorrt' package at {tmp_path / 'tensorrt'} has no Builder" in reason
    assert "pip uninstall tensorrt-stubs" in reason and reason.endswith("; building ONNX variants only")
    assert "empty namespace package" in str(result["error"]) and "pip uninstall tensorrt-stubs" in str(result["error"])


@pytest.mark.parametrize(
    "source, expected",
    [
        ("__version__ = '8.6.1'\nclass Builder: pass\n", "TensorRT 8.6.1 is older than 10.8"),
        ("__version__ = '12.0.1'\nclass Builder: pass\n", "TensorRT 12.0.1 is newer than the versions this pipeline is checked against (below 12)"),
        ("__version__ = '10.13.0.35'\nclass Builder: pass\n", "no CUDA GPU found ("),
        ("raise OSError('libnvinfer.so.10: cannot open shared object file')\n", "no CUDA GPU found ("),
    ],
    ids=["too-old", "too-new", "no-gpu", "import-fails-without-gpu"],
)
def test_status_after_import_checks_version_then_gpu(tmp_path: Path, source: str, expected: str) -> None:
    """Mocks TensorRT: a fake ``tensorrt`` module (only ``Builder``/``__version__``, or one whose import fails).

    The GPU probe is real (CUDA driver via ctypes), so the no-GPU cases need a machine without a GPU.
    """
    if HAS_GPU and expected.startswith("no CUDA GPU"):
        pytest.skip("a real GPU is present, so the no-GPU reason cannot appear")
    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.py").write_text(source)
    result = run_python(
        "import json\nfrom pipeline.backend.tensorrt_env import tensorrt_status\nprint(json.dumps(tensorrt_status()))",
        tmp_path,
    )
    ok, reason = result
    assert ok is False and reason.startswith(f"TensorRT engine step not run: {expected}"), reason


def test_gpu_probe_reports_a_gpu_or_why_not() -> None:
    gpu = tensorrt_env._probe_gpu()
    if isinstance(gpu, GpuInfo):
        assert gpu.name and gpu.compute_capability[0] >= 5
        assert tensorrt_env.cuda_gpu() == gpu
    else:
        assert gpu.startswith("no CUDA GPU found (") and "\n" not in gpu
        with pytest.raises(PipelineError, match="NVIDIA GPU and driver"):
            tensorrt_env.cuda_gpu()


def test_module_imports_without_tensorrt_or_polygraphy_trt() -> None:
    code = "import sys, pipeline.stages.engine, pipeline.backend.trt_seam, pipeline.backend.plan_runner; print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorrt' or m.startswith('polygraphy.backend.trt')))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_engine_never_sets_precision_builder_flags() -> None:
    """Precision comes from the ONNX graph: the build half (trt_compile) sets and clears only BuilderFlag.TF32, never
    FP16/INT8/BF16/FP8; every timing cache is attached with ignore_mismatch=False (TensorRT-RTX ignores timing caches, so
    only this reading of the source sees a mismatched cache allowed in)."""
    from pipeline.backend import trt_compile, trt_seam

    seam = ast.parse(Path(trt_seam.__file__).read_text())
    assert not {n.attr for n in ast.walk(seam) if isinstance(n, ast.Attribute)} & {"BuilderFlag", "set_flag", "clear_flag"}
    tree = ast.parse(Path(trt_compile.__file__).read_text())
    flags = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
             and n.value.attr == "BuilderFlag"]
    assert flags == ["trt.BuilderFlag.TF32", "trt.BuilderFlag.TF32"]
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & {"FP16", "INT8", "BF16", "FP8", "FP4", "INT4"}
    caches = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "set_timing_cache"]
    assert len(caches) == 2 and all([ast.unparse(k) for k in c.keywords] == ["ignore_mismatch=False"] for c in caches)


def test_parser_words_are_one_line_without_the_driver_noise() -> None:
    from pipeline.backend.trt_compile import ParserFailure, parser_words

    desc = ("Invalid Node - conv_DequantizeLinear\nITensor::getDimensions: Error Code 4: API Usage Error (conv_DequantizeLinear: input has "
            "type Int32 but must have type FP8, FP4, Int4, Int8, or UInt8. In checkType at /_src/optimizer/common/nodeBase.cpp:456)\n"
            "[checkMacros.cpp::catchCudaError::250] Error Code 1: Cuda Runtime (In catchCudaError at /_src/common/dispatch/checkMacros."
            "cpp:250 (cudaError 35: CUDA driver version is insufficient for CUDA runtime version))")
    words = parser_words(desc)
    assert words == ("ITensor::getDimensions: Error Code 4: API Usage Error (conv_DequantizeLinear: input has type Int32 but must have "
                     "type FP8, FP4, Int4, Int8, or UInt8.)")
    assert parser_words("Invalid Node - n1") == "Invalid Node - n1"  # nothing else said: kept
    assert ParserFailure(3, "n1", "Foo", "No importer registered for op: Foo").line() == "node 3 'n1' (Foo): No importer registered for op: Foo"


@pytest.mark.parametrize(
    "profiles, message",
    [
        ([], "inputs image have dynamic axes but no optimization profile"),
        ([ShapeProfile({"other": ((1, 8, 8, 1), (1, 8, 8, 1), (1, 8, 8, 1))})], "missing dynamic inputs: \\['image'\\]"),
        ([ShapeProfile({"image": ((4, 8, 8, 1), (2, 8, 8, 1), (8, 8, 8, 1))})], "shape range image:4x8x8x1/2x8x8x1/8x8x8x1"),
        ([ShapeProfile({"image": ((1, 9, 8, 1), (2, 9, 8, 1), (8, 9, 8, 1))})], "of shape \\[-1, 8, 8, 1\\]"),
        ([ShapeProfile({"image": ((1, 8, 8), (2, 8, 8), (8, 8, 8))})], "MIN <= OPT <= MAX"),
    ],
)
def test_profiles_are_checked_against_the_network_before_tensorrt(profiles: list[ShapeProfile], message: str) -> None:
    from pipeline.backend.trt_seam import check_profiles

    with pytest.raises(PipelineError, match=message):
        check_profiles({"image": (-1, 8, 8, 1)}, profiles)


def test_checked_profiles_drop_empty_ones() -> None:
    from pipeline.backend.trt_seam import check_profiles

    good = ShapeProfile({"image": ((1, 8, 8, 1), (32, 8, 8, 1), (64, 8, 8, 1))})
    assert check_profiles({"image": (-1, 8, 8, 1)}, [ShapeProfile({}), good]) == [good]
    assert check_profiles({"image": (1, 8, 8, 1)}, []) == []  # static: no profile needed


def test_metadata_from_plain_values(tmp_path: Path) -> None:
    plan = tmp_path / "digits_int8.plan"
    plan.write_bytes(b"\0" * 1234)
    onnx_path = tiny_onnx(tmp_path / "digits_int8.onnx")
    io = [
        IOTensor("image", "input", "FLOAT", (-1, 8, 8, 1)),
        IOTensor("probs", "output", "HALF", (-1, 10)),
        IOTensor("extra", "output", "FP8", (-1,)),
    ]
    profiles = [ShapeProfile({"image": ((1, 8, 8, 1), (64, 8, 8, 1), (64, 8, 8, 1))})]
    meta = engine_metadata(
        precision="int8", plan_path=plan, onnx_path=onnx_path, tensorrt_version="10.13.0.35",
        gpu=GpuInfo("NVIDIA A100-SXM4-40GB MIG 1g.5gb", (8, 0)), io=io, profiles=profiles,
        device_memory_bytes=4096, build_seconds=12.34567, settings={"optimization_level": 3},
    )
    assert meta["plan"] == "digits_int8.plan" and meta["plan_bytes"] == 1234 and len(meta["plan_sha256"]) == 64
    assert meta["gpu"] == {"index": 0, "name": "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "compute_capability": "8.0"}
    assert meta["inputs"] == [{"name": "image", "dtype": "float32", "trt_dtype": "FLOAT", "shape": [-1, 8, 8, 1]}]
    assert [o["dtype"] for o in meta["outputs"]] == ["float16", "fp8"]
    assert meta["profiles"] == [{"image": {"min": [1, 8, 8, 1], "opt": [64, 8, 8, 1], "max": [64, 8, 8, 1]}}]
    assert meta["build_seconds"] == 12.346 and meta["strongly_typed"] is True
    assert (meta["hardware_compatibility"], meta["tf32"], meta["host_code_allowed"]) == ("NONE", True, False)

    path = metadata_path(plan)
    assert path.name == "digits_int8.plan.json"
    write_engine_metadata(path, meta)
    assert read_engine_metadata(path) == meta


def test_read_metadata_errors(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="does not exist"):
        read_engine_metadata(tmp_path / "x.plan.json")
    (tmp_path / "old.plan.json").write_text(json.dumps({"format": 0}))
    with pytest.raises(PipelineError, match="not in format 1"):
        read_engine_metadata(tmp_path / "old.plan.json")
    (tmp_path / "broken.plan.json").write_text('{"format": 1, "inputs": [')
    with pytest.raises(PipelineError, match="broken.plan.json is not valid JSON"):
        read_engine_metadata(tmp_path / "broken.plan.json")


@pytest.mark.slow
def test_engine_module_type_checks_against_tensorrt_stubs() -> None:
    """Runs .ci/mypy-engine.sh for real (pip-installs tensorrt-stubs into .ci/stubs on first run)."""
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / ".ci" / "mypy-engine.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Success: no issues found in 8 source files" in proc.stdout  # the strict list in .ci/mypy-engine.sh
    if NO_TENSORRT:  # the stubs stayed private: this interpreter still finds no `tensorrt`
        check = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('tensorrt'))"],
                               cwd=ROOT / "tests", capture_output=True, text=True, timeout=60)
        assert check.stdout.strip() == "None", check.stdout


def test_plans_are_never_deserialized_through_polygraphys_engine_from_bytes() -> None:
    """EngineFromBytes sets engine_host_code_allowed = True for every plan; the seam deserializes
    itself and sets the flag from its argument (False unless --allow-plan-host-code)."""
    def names(tree: ast.AST) -> set[str]:
        return ({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
                | {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names})

    assert not [p for p in (ROOT / "pipeline").rglob("*.py") if "EngineFromBytes" in names(ast.parse(p.read_text()))]
    from pipeline.backend import trt_seam

    tree = ast.parse(Path(trt_seam.__file__).read_text())
    assigned = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "engine_host_code_allowed" for t in n.targets)]
    assert [ast.unparse(n.value) for n in assigned] == ["allow_host_code"]
