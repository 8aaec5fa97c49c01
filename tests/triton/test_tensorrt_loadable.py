"""The ONNX Runtime backend's ``tensorrt_loadable``: TensorRT 10 and 11 runtime libraries.

TensorRT cannot be installed here, so the real library names can only be absent; a library every
Linux host has (the C library) stands in for a present ``libnvinfer`` to show each name is tried.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pipeline.triton.server import OUR_BACKENDS


@pytest.fixture(scope="module")
def backend() -> ModuleType:
    """The backend's model.py, imported with the real triton_python_backend_utils shipped in the wheel."""
    import pytriton

    sys.path.insert(0, str(Path(pytriton.__file__).parent / "tritonserver" / "backends" / "python"))
    try:
        spec = importlib.util.spec_from_file_location("ort_backend_model_trt", OUR_BACKENDS / "onnxruntime" / "model.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    return module


def test_both_supported_tensorrt_majors_are_looked_for(backend: ModuleType) -> None:
    assert backend.NVINFER_LIBRARIES == ("libnvinfer.so.11", "libnvinfer.so.10")
    assert backend.tensorrt_loadable() is False  # neither exists on this machine


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs the GNU C library's soname")
def test_any_of_the_libraries_loading_is_enough(backend: ModuleType) -> None:
    assert backend.tensorrt_loadable(("libnvinfer.so.11", "libc.so.6")) is True
    assert backend.tensorrt_loadable(("libnvinfer.so.11", "libnvinfer.so.10")) is False
