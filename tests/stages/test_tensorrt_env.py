"""The supported TensorRT range (one definition, the same in pyproject.toml) and the driver check.

No NVIDIA driver exists here, so the driver's CUDA version is given to :func:`driver_problem` as a
number (what ``cuDriverGetVersion`` returns); the ctypes probe itself runs for real and finds none.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from pipeline.stages import tensorrt_env
from pipeline.stages.tensorrt_env import CUDA_OF_TENSORRT, MAX_TENSORRT, MIN_TENSORRT, driver_problem

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_pins_the_range_tensorrt_env_defines() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["tensorrt"] == [f"tensorrt>={MIN_TENSORRT[0]}.{MIN_TENSORRT[1]},<{MAX_TENSORRT[0]}"]
    assert MAX_TENSORRT == (max(CUDA_OF_TENSORRT) + 1, 0)  # every major below the bound has its CUDA known


@pytest.mark.parametrize(
    "tensorrt, driver_cuda, needs",
    [
        ("11.4.0.106", 12080, "install NVIDIA driver r580 or newer, or TensorRT 10 for CUDA 12 (pip install 'tensorrt>=10.8,<11')"),
        ("10.16.1.11", 11080, "install NVIDIA driver r525 (525.60.13) or newer"),
    ],
)
def test_a_driver_too_old_for_the_tensorrt_cuda_names_the_driver_it_needs(tensorrt: str, driver_cuda: int, needs: str) -> None:
    problem = driver_problem(tensorrt, driver_cuda)
    assert problem is not None
    text, fix = problem
    assert text.startswith(f"TensorRT {tensorrt} is built for CUDA {CUDA_OF_TENSORRT[int(tensorrt.split('.')[0])]}, but the NVIDIA driver "
                           f"supports CUDA {driver_cuda // 1000}.{driver_cuda % 1000 // 10} at most")
    assert fix == needs and "\n" not in text + fix


@pytest.mark.parametrize("tensorrt, driver_cuda", [("11.0.0", 13000), ("11.4.0.106", 13020), ("10.8.0", 12000), ("10.16.1", 13000)])
def test_a_new_enough_driver_is_no_problem(tensorrt: str, driver_cuda: int) -> None:
    assert driver_problem(tensorrt, driver_cuda) is None


def test_driver_probe_without_a_driver_is_none() -> None:
    if not isinstance(tensorrt_env._load_libcuda(), str):
        pytest.skip("an NVIDIA driver is present")
    assert tensorrt_env._driver_cuda_version() is None
