"""The artifacts a build hands from stage to stage and finally to the Triton repository."""

from __future__ import annotations

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
