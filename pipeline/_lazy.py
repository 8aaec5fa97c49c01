"""Lazy imports of heavy or optional dependencies, with an error that names the pip extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from pipeline.errors import PipelineError


def import_optional(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise a PipelineError naming the pip extra that provides it (``pip install '.[extra]'``)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PipelineError(
            f"{purpose} needs the Python module '{module}', which is not importable ({exc})",
            f"install it with: pip install '.[{extra}]'" + (" (or '.[gpu]' on a CUDA machine)" if extra == "cpu" else ""),
        ) from None


def import_tensorflow(purpose: str) -> ModuleType:
    """TensorFlow, from the ``cpu`` extra (tensorflow-cpu) or the ``gpu`` extra (tensorflow with CUDA)."""
    return import_optional("tensorflow", "cpu", purpose)
