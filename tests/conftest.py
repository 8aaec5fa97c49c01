"""Shared test helpers: run the real CLI in a subprocess, and locate repo files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path = ROOT, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pipeline ARGS`` for real; tests/ is importable so `tests.keras_models:…` works."""
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), TF_CPP_MIN_LOG_LEVEL="3", COLUMNS="200")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """Assert the process failed as a user error: exit 2, no traceback, one 'error:' line; return it."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    return errors[0]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT
