"""Run an ONNX model under ONNX Runtime's real AVX2 kernels on any x86 machine: this interpreter under
``qemu-x86_64 -cpu Haswell`` (Debian's ``qemu-user``; a CPUID of AVX2 without VNNI, so ONNX Runtime picks its non-VNNI
integer kernels). Tests skip with the reason where qemu is missing (scripts/setup.sh installs it where it can)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
QEMU = shutil.which("qemu-x86_64")
needs_qemu = pytest.mark.skipif(QEMU is None or platform.machine() != "x86_64",
                                reason="qemu-user is not installed (apt-get install qemu-user; scripts/setup.sh does where it can): "
                                       "the real AVX2 kernels cannot be run on this machine")

_RUN = """
import sys, numpy as np
from pipeline.backend.onnxrt import session_from_onnx
session = session_from_onnx(sys.argv[1])
with np.load(sys.argv[2]) as feed:
    outputs = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})
np.savez(sys.argv[3], *outputs)
"""


def haswell(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by this Python under ``qemu-x86_64 -cpu Haswell``, with the repository importable."""
    assert QEMU is not None
    return subprocess.run([QEMU, "-cpu", "Haswell", sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600, check=False)


def outputs_under_haswell(model: Path, feed: dict[str, np.ndarray], workdir: Path) -> list[np.ndarray]:
    """``model``'s outputs on ``feed`` (input name → array) computed under the AVX2 kernels."""
    workdir.mkdir(parents=True, exist_ok=True)
    np.savez(workdir / "feed.npz", **feed)
    done = haswell(_RUN, str(model), str(workdir / "feed.npz"), str(workdir / "out.npz"))
    assert done.returncode == 0, done.stderr[-2000:]
    with np.load(workdir / "out.npz") as out:
        return [out[f"arr_{i}"] for i in range(len(out.files))]


def native_outputs(model: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The same here, with this machine's kernels."""
    from pipeline.backend.onnxrt import session_from_onnx

    session = session_from_onnx(model)
    return session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})
