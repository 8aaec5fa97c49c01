"""The supported TensorRT range (one definition, the same in pyproject.toml) and the driver check.

No NVIDIA driver exists here, so the driver's CUDA version is given to :func:`driver_problem` as a
number (what ``cuDriverGetVersion`` returns); the ctypes probe itself runs for real and finds none.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from pipeline.backend import tensorrt_env
from pipeline.backend.tensorrt_env import CUDA_OF_TENSORRT, MAX_TENSORRT, MIN_TENSORRT, driver_problem

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_pins_the_range_tensorrt_env_defines() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["tensorrt"] == [f"tensorrt>={MIN_TENSORRT[0]}.{MIN_TENSORRT[1]},<{MAX_TENSORRT[0]}"]
    assert MAX_TENSORRT == (max(CUDA_OF_TENSORRT) + 1, 0)  # every major below the bound has its CUDA known


@pytest.mark.parametrize(
    "tensorrt, cuda, driver_cuda, needs",
    [
        ("11.4.0.106", 13, 12080, "install NVIDIA driver r580 or newer, or the TensorRT wheels for CUDA 12 "
                                  "(pip install 'tensorrt-cu12>=10.8,<12')"),
        # `pip install tensorrt` 10.16 pulls tensorrt_cu13: a 10.x is not necessarily CUDA 12 (the old check said so)
        ("10.16.1.11", 13, 12020, "install NVIDIA driver r580 or newer, or the TensorRT wheels for CUDA 12 "
                                  "(pip install 'tensorrt-cu12>=10.8,<12')"),
        ("10.8.0.43", 12, 11080, "install NVIDIA driver r525 (525.60.13) or newer, or the TensorRT wheels for CUDA 11 "
                                 "(pip install 'tensorrt-cu11>=10.8,<11')"),
    ],
)
def test_a_driver_too_old_for_the_tensorrt_cuda_names_the_driver_it_needs(tensorrt: str, cuda: int, driver_cuda: int, needs: str) -> None:
    problem = driver_problem(tensorrt, cuda, driver_cuda)
    assert problem is not None
    text, fix = problem
    assert text.startswith(f"TensorRT {tensorrt} is built for CUDA {cuda}, but the NVIDIA driver "
                           f"supports CUDA {driver_cuda // 1000}.{driver_cuda % 1000 // 10} at most")
    assert fix == needs and "\n" not in text + fix


@pytest.mark.parametrize("tensorrt, cuda, driver_cuda", [("11.0.0", 13, 13000), ("11.4.0.106", 12, 12020), ("10.8.0", 12, 12000),
                                                         ("10.16.1", 13, 13000)])
def test_a_new_enough_driver_is_no_problem(tensorrt: str, cuda: int, driver_cuda: int) -> None:
    assert driver_problem(tensorrt, cuda, driver_cuda) is None


@pytest.mark.parametrize("names, cuda", [
    (["tensorrt", "tensorrt_cu13", "tensorrt_cu13_libs", "tensorrt_cu13_bindings"], 13),  # `pip install tensorrt` (10.16 or 11.4)
    (["tensorrt-cu12", "tensorrt-cu12-libs", "tensorrt-cu12-bindings"], 12),
    (["tensorrt_cu12_libs", "tensorrt_cu13_bindings"], 12),  # the libraries are what the driver runs
    (["tensorrt", "numpy"], None),  # a tarball or NGC container install: no wheel says its CUDA
])
def test_the_cuda_of_tensorrt_comes_from_its_wheels(names: list[str], cuda: int | None) -> None:
    assert tensorrt_env.tensorrt_wheel_cuda(names) == cuda
    for major, cudas in CUDA_OF_TENSORRT.items():
        assert all(c in tensorrt_env.DRIVER_FOR_CUDA for c in cudas), major


def test_driver_probe_without_a_driver_is_none() -> None:
    if not isinstance(tensorrt_env._load_libcuda(), str):
        pytest.skip("an NVIDIA driver is present")
    assert tensorrt_env._driver_cuda_version() is None
