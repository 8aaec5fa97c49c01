"""The artifacts a build hands from stage to stage and finally to the Triton repository."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PRECISIONS = ("fp32", "fp16", "int8")  # what TensorRT builds engines of (and any Triton instance kind serves)
# Variants made for ONNX Runtime's CPU integer kernels: published with KIND_CPU instances and ORT's
# graph optimizations on, never built into an engine. ``int8cpu``: uint8 activations, int8 weights.
CPU_PRECISIONS = ("int8cpu",)
# Variants that change what a client sends, not how the model computes; ONNX only, no engine.
# ``u8``: the FP32 model taking uint8 image inputs (pipeline.stages.uint8_input).
WIRE_PRECISIONS = ("u8",)
VARIANTS = PRECISIONS + CPU_PRECISIONS + WIRE_PRECISIONS
# What answers raw requests (build --raw-inputs): the image preprocessing graph (an ONNX file) or the tokenizer (a Python
# model's model.py), and the ensemble (no model file of its own; its artifact path is a file whose hash says when the
# step in front changed).
RAW_KINDS = ("guard", "preprocess", "tokenize", "ensemble", "preprocess_hwc", "ensemble_hwc")


@dataclass(frozen=True)
class Artifact:
    """One deployable model file: an ONNX variant or a TensorRT plan of one precision.

    ``metadata`` is the engine's metadata JSON for plans (TensorRT version, GPU, I/O, profiles,
    device memory), ``None`` for ONNX files.
    """

    precision: str  # one of VARIANTS ("raw" for the raw-input models)
    kind: str  # "onnx" | "plan" | RAW_KINDS
    path: Path
    metadata: Path | None = None

    def triton_name(self, model: str) -> str:
        """The Triton model name: ``<model>_<precision>`` for ONNX, ``<model>_<precision>_trt`` for plans; the raw-input
        ensemble is ``<model>`` and its preprocessing ``<model>_preprocess``."""
        if self.kind in RAW_KINDS:
            return model if self.kind == "ensemble" else (f"{model}_hwc" if self.kind == "ensemble_hwc" else f"{model}_{self.kind}")
        suffix = "" if self.kind == "onnx" else "_trt"
        return f"{model}_{self.precision}{suffix}"

    @property
    def cpu_only(self) -> bool:
        """Whether this variant is made for ONNX Runtime's CPU kernels (see :data:`CPU_PRECISIONS`)."""
        return self.precision in CPU_PRECISIONS

    def fingerprint(self) -> str:
        """The content hash of the model file (what the stage cache keys on)."""
        from pipeline.core.fingerprint import hash_path

        return hash_path(self.path)


# A Triton model name the pipeline publishes: groups base, precision, trt (``_trt`` for plans).
VARIANT_NAME = re.compile(rf"^(?P<base>.+)_(?P<precision>{'|'.join(sorted(VARIANTS, key=len, reverse=True))})(?P<trt>_trt)?$")


def parse_variant(triton_name: str) -> tuple[str, str] | None:
    """The inverse of :meth:`Artifact.triton_name`: ``digits_int8_trt`` → (``digits``, ``int8``), ``digits_int8cpu`` →
    (``digits``, ``int8cpu``); None for other names."""
    match = VARIANT_NAME.match(triton_name)
    return (match["base"], match["precision"]) if match else None
