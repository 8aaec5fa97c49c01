"""Every TensorRT name the package uses exists in each supported TensorRT version's API.

TensorRT cannot be installed here (no GPU), so its API comes from the name lists that
scripts/trt_api_names.py extracted from the real binding wheels (tests/fixtures/tensorrt-api-*.txt).
The linker merges string tails, so a name is found when it is a suffix of a listed string.

Names used:
* every attribute chain on a name bound to the ``tensorrt`` module anywhere under pipeline/
  (``trt.MemoryPoolType.WORKSPACE``, annotations such as ``trt.ICudaEngine`` included), read from the AST;
* the names reached dynamically (``getattr(trt.HardwareCompatibilityLevel, level)``): the levels in
  ``HARDWARE_LEVELS``;
* methods and properties used on TensorRT objects, which the AST cannot type: ``OBJECT_NAMES``. A
  test keeps that list complete: every attribute the seam module touches is either a ``trt`` chain,
  in ``OBJECT_NAMES``, or in ``NOT_TENSORRT`` (attributes of the pipeline's own or Python objects).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from pipeline.backend import trt_compile, trt_seam
from pipeline.backend.tensorrt_env import CUDA_OF_TENSORRT, MAX_TENSORRT, MIN_TENSORRT
from pipeline.backend.trt_seam import HARDWARE_LEVELS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pipeline"
FIXTURES = ROOT / "tests" / "fixtures"
CHECKED = {10: "10.16.1.11", 11: "11.4.0.106"}  # the latest release of each supported major when extracted

# Used on TensorRT objects (engine, network, builder, builder config, parser errors, runtime, tensors, enum values) in
# pipeline/backend/trt_seam.py and pipeline/backend/trt_compile.py (the build half, which takes the module as an argument).
OBJECT_NAMES = {
    "get_input", "num_inputs", "get_output", "num_outputs", "num_layers", "name", "shape", "dtype", "get_flag",  # INetworkDefinition, ITensor
    "create_network", "create_builder_config", "create_optimization_profile", "build_serialized_network",  # IBuilder
    "parse_from_file", "num_errors", "get_error", "node", "node_name", "node_operator", "desc", "code", "func",  # OnnxParser, ParserError
    "set_shape", "get_shape", "add_optimization_profile", "builder_optimization_level", "set_memory_pool_limit",  # IOptimizationProfile,
    "get_memory_pool_limit", "set_flag", "clear_flag", "hardware_compatibility_level",  # IBuilderConfig
    "create_timing_cache", "set_timing_cache", "ignore_mismatch", "get_timing_cache", "serialize",  # IBuilderConfig, ITimingCache
    "num_io_tensors", "get_tensor_name", "get_tensor_mode", "get_tensor_dtype", "get_tensor_shape",  # ICudaEngine
    "num_optimization_profiles", "get_tensor_profile_shape", "device_memory_size_v2",
    "create_execution_context",
    "engine_host_code_allowed", "deserialize_cuda_engine",  # IRuntime
}
# TensorRT names Polygraphy (the installed version) calls on the seam's behalf, unguarded: TrtRunner (activate, set_profile,
# infer) and str_from_engine. Read from polygraphy/backend/trt/{runner,util}.py 0.53.6; a name missing from a TensorRT
# version would fail there on a GPU even though the seam's own names all exist.
THROUGH_POLYGRAPHY = {
    "create_execution_context", "set_optimization_profile_async", "active_optimization_profile", "set_input_shape",
    "set_tensor_address", "get_tensor_address", "execute_async_v3", "is_shape_inference_io", "get_aliased_input_tensor",
    "IOutputAllocator", "set_output_allocator", "get_tensor_format", "get_tensor_vectorized_dim",
    "get_tensor_components_per_element",  # TrtRunner, str_from_engine
}
# Attributes the seam touches that are not TensorRT's.
NOT_TENSORRT = {
    "getLogger", "info", "warning", "debug", "shapes", "items", "add", "onnx_path", "profiles", "workspace_mib", "hardware_compatibility",
    "optimization_level", "tf32", "timing_cache", "read_bytes", "splitlines", "strip", "TYPE_CHECKING", "status", "join", "append",
    "frozen", "precision", "plan", "facts", "gpu", "io", "device_memory_bytes", "tensorrt_version", "compute_capability", "mode",
    "errors", "failures", "line", "message", "problem", "op", "sub", "startswith", "compile", "catch_warnings", "simplefilter", "layers",
    "strongly_typed", "timing_cache_loaded", "workspace_bytes", "__version__",
}
# A name that exists in only one supported major, and the majors the code needs it in (it branches on the version there).
ONLY_IN: dict[str, set[int]] = {}
# Names of 10.x that 11.x removed: facts about the fixtures, and names the package must not use unguarded.
REMOVED_IN_11 = {"device_memory_size"}


@cache
def api(major: int) -> tuple[str, ...]:
    lines = (FIXTURES / f"tensorrt-api-{CHECKED[major]}.txt").read_text().splitlines()
    return tuple(line for line in lines if line and not line.startswith("#"))


def exists(name: str, major: int) -> bool:
    return any(entry.endswith(name) for entry in api(major))


def _chain(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def tensorrt_names(source: str) -> Iterator[tuple[int, str]]:
    """(line, name) of every attribute chain on a name the module binds to ``tensorrt``."""
    tree = ast.parse(source)
    aliases = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names if a.name == "tensorrt"}
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:  # outermost attribute of a chain
            chain = _chain(node)
            if chain and chain[0] in aliases:
                yield from ((node.lineno, part) for part in chain[1:])


def package_names() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, name in tensorrt_names(path.read_text()):
            found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{line}")
    for name in (*OBJECT_NAMES, *HARDWARE_LEVELS):
        found.setdefault(name, []).append("listed")
    return found


def missing(names: dict[str, list[str]]) -> list[str]:
    """``name (where) in TensorRT x`` for every name absent from a version that needs it."""
    return [f"{name} ({', '.join(where)}) in TensorRT {CHECKED[major]}" for name, where in sorted(names.items())
            for major in sorted(ONLY_IN.get(name, CHECKED)) if not exists(name, major)]


def test_the_checked_versions_are_the_supported_majors() -> None:
    assert set(CHECKED) == set(range(MIN_TENSORRT[0], MAX_TENSORRT[0])) == set(CUDA_OF_TENSORRT)


def test_every_tensorrt_name_the_package_uses_exists_in_every_supported_version() -> None:
    names = package_names()
    assert {"MemoryPoolType", "WORKSPACE", "TensorIOMode", "INPUT", "HardwareCompatibilityLevel", "Runtime", "__version__",
            "ICudaEngine"} <= set(names)
    assert missing(names) == []


def test_every_tensorrt_name_polygraphy_calls_for_the_seam_exists_in_every_supported_version() -> None:
    import polygraphy

    source = "\n".join(path.read_text() for path in (Path(polygraphy.__file__).parent / "backend" / "trt").glob("*.py"))
    assert {name for name in THROUGH_POLYGRAPHY if name not in source} == set()  # the list names what Polygraphy really calls
    assert missing({name: ["polygraphy"] for name in THROUGH_POLYGRAPHY}) == []


def test_a_misspelt_name_in_a_scratch_copy_fails(tmp_path: Path) -> None:
    scratch = tmp_path / "trt_seam.py"
    scratch.write_text(Path(trt_seam.__file__).read_text().replace("trt.TensorIOMode.INPUT", "trt.TensorIOMode.INPTU"))
    names = {name: [str(scratch)] for _, name in tensorrt_names(scratch.read_text())}
    assert missing(names) == [f"INPTU ({scratch}) in TensorRT {CHECKED[10]}", f"INPTU ({scratch}) in TensorRT {CHECKED[11]}"]


def test_the_list_of_names_used_on_tensorrt_objects_is_complete() -> None:
    attributes: set[str] = set()
    on_trt: set[str] = set()
    for module in (trt_seam, trt_compile):
        source = Path(module.__file__).read_text()  # type: ignore[arg-type]
        tree = ast.parse(source)
        attributes |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        attributes |= {k.arg for node in ast.walk(tree) if isinstance(node, ast.Call) for k in node.keywords if k.arg}
        on_trt |= {name for _, name in tensorrt_names(source)}
    keywords = {"name", "show_layers", "where", "configure", "allow_host_code", "tensorrt_version", "gpu", "io", "profiles",  # the seam's own
                "device_memory_bytes", "hardware_compatibility", "strongly_typed", "layers", "timing_cache_loaded", "workspace_bytes"}
    assert attributes - on_trt - OBJECT_NAMES - NOT_TENSORRT - keywords == set()
    assert OBJECT_NAMES <= attributes  # nothing listed that the seam no longer uses


def test_the_build_half_names_tensorrt_only_through_the_module_it_is_given() -> None:
    """compile_plan takes the module (``tensorrt``, or ``tensorrt_rtx`` for the check): every ``trt.`` chain in it is a
    TensorRT name checked above, and TensorRT-RTX's own names (compute capabilities) stay out of it."""
    source = Path(trt_compile.__file__).read_text()  # type: ignore[arg-type]
    names = {name for _, name in tensorrt_names(source)}
    assert {"NetworkDefinitionCreationFlag", "STRONGLY_TYPED", "MemoryPoolType", "WORKSPACE", "BuilderFlag", "TF32", "OnnxParser",
            "Builder", "HardwareCompatibilityLevel", "init_libnvinfer_plugins"} <= names
    assert "ComputeCapability" not in source and "set_compute_capability" not in source


@pytest.mark.parametrize("name", sorted(REMOVED_IN_11))
def test_names_removed_in_11_are_known_and_unused(name: str) -> None:
    assert exists(name, 10) and not exists(name, 11)
    assert name not in package_names() or ONLY_IN.get(name) == {10}


def test_only_in_lists_names_that_really_exist_in_one_major() -> None:
    for name, majors in ONLY_IN.items():
        assert {m for m in CHECKED if exists(name, m)} == majors
