"""Lazy imports of heavy or optional dependencies, with an error that names the pip extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from pipeline.core.errors import PipelineError


def import_optional(module: str, extra: str | None, purpose: str) -> ModuleType:
    """Import ``module`` or raise a PipelineError naming the pip extra that provides it (``pip install '.[extra]'``);
    ``extra`` None: the module comes with the project's own dependencies (``pip install -e .``)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if extra is None:
            fix = "reinstall the project's dependencies: pip install -e ."
        else:
            fix = f"install it with: pip install '.[{extra}]'" + (" (or '.[gpu]' on a CUDA machine)" if extra == "cpu" else "")
        raise PipelineError(f"{purpose} needs the Python module '{module}', which is not importable ({exc})", fix) from None


def import_tensorflow(purpose: str) -> ModuleType:
    """TensorFlow, from the ``cpu`` extra (tensorflow-cpu) or the ``gpu`` extra (tensorflow with CUDA)."""
    return import_optional("tensorflow", "cpu", purpose)
