"""Lazy imports of heavy or optional dependencies, with an error that names the pip extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from pipeline.errors import PipelineError


def import_optional(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise a PipelineError naming ``pip install 'keras-trt-pipeline[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PipelineError(
            f"{purpose} needs the Python module '{module}', which is not importable ({exc})",
            f"install it with: pip install '.[{extra}]'",
        ) from None
