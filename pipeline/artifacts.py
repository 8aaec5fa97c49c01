"""The artifacts a build hands from stage to stage and finally to the Triton repository."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PRECISIONS = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class Artifact:
    """One deployable model file: an ONNX variant or a TensorRT plan of one precision.

    ``metadata`` is the engine's metadata JSON for plans (TensorRT version, GPU, I/O, profiles,
    device memory), ``None`` for ONNX files.
    """

    precision: str  # one of PRECISIONS
    kind: str  # "onnx" | "plan"
    path: Path
    metadata: Path | None = None

    def triton_name(self, model: str) -> str:
        """The Triton model name: ``<model>_<precision>`` for ONNX, ``<model>_<precision>_trt`` for plans."""
        suffix = "" if self.kind == "onnx" else "_trt"
        return f"{model}_{self.precision}{suffix}"

    def fingerprint(self) -> str:
        """The content hash of the model file (what the stage cache keys on)."""
        from pipeline.fingerprint import hash_path

        return hash_path(self.path)


_VARIANT = re.compile(r"^(?P<base>.+)_(?P<precision>fp32|fp16|int8)(?P<trt>_trt)?$")


def parse_variant(triton_name: str) -> tuple[str, str] | None:
    """The inverse of :meth:`Artifact.triton_name`: ``digits_int8_trt`` → (``digits``, ``int8``); None for other names."""
    match = _VARIANT.match(triton_name)
    return (match["base"], match["precision"]) if match else None
