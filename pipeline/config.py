"""Typed settings of a build: what the CLI parses into, and what the orchestrator reads."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.stages.int8 import CALIBRATION_METHODS
from pipeline.stages.shapes import SHAPE_SYNTAX, well_formed
from pipeline.stages.source import DEFAULT_MODEL, ModelSource

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$")


@dataclass(frozen=True)
class Gates:
    """Accuracy tolerances. Accuracy drops are in percentage points of top-1 accuracy."""

    parity_atol: float = 1e-4
    parity_rtol: float = 0.0
    fp16_max_drop: float = 0.2
    int8_max_drop: float = 1.0
    fp16_atol: float = 1e-2
    int8_atol: float | None = None  # INT8 is gated on accuracy; its elementwise error is reported


@dataclass(frozen=True)
class Workspace:
    """Where one model's build artifacts live: ``<workdir>/<name>/``."""

    root: Path

    @property
    def savedmodel(self) -> Path:
        return self.root / "savedmodel"

    def onnx(self, precision: str) -> Path:
        return self.root / f"model.{precision}.onnx"

    def plan(self, precision: str) -> Path:
        return self.root / "engines" / f"model.{precision}.plan"

    @property
    def timing_cache(self) -> Path:
        return self.root / "engines" / "timing.cache"

    @property
    def parity(self) -> Path:
        return self.root / "parity.json"

    @property
    def accuracy(self) -> Path:
        return self.root / "accuracy.json"

    @property
    def published(self) -> Path:
        return self.root / "published.json"

    @property
    def served(self) -> Path:
        return self.root / "served.json"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"


@dataclass(frozen=True)
class BuildConfig:
    """Everything a build needs; see ``python -m pipeline build --help`` for each option."""

    model: str = DEFAULT_MODEL
    name: str | None = None
    workdir: Path = Path("build")
    repository: Path = Path("model_repository")
    calibration_root: Path = Path("calibration")
    eval_data: Path | None = None
    opset: int = 17
    max_batch: int = 64
    fp16: bool = False
    int8: bool = False
    calibration: Path | None = None
    calibration_method: str = "minmax"
    preprocess: str = "unit"
    shapes: tuple[str, ...] = ()
    engine: bool = True
    optimization_level: int = 3
    version_policy: str = "new"
    mig: str | None = None
    triton_image: str | None = None
    verify_served: bool = False
    verify_url: str | None = None
    gates: Gates = field(default_factory=Gates)
    command: str = "python -m pipeline build"

    @property
    def precisions(self) -> tuple[str, ...]:
        return ("fp32",) + (("fp16",) if self.fp16 else ()) + (("int8",) if self.int8 else ())

    def model_name(self, source: ModelSource) -> str:
        """``--name``, else the file stem / folder name / module name (``digits`` for the default)."""
        if self.name:
            name = self.name
        elif source.path is not None:
            name = source.path.stem if source.kind == "keras" else source.path.resolve().name
        else:
            name = source.spec.partition(":")[0].rsplit(".", 1)[-1]
        if not _NAME.match(name):
            raise PipelineError(
                f"model name '{name}' is not a valid Triton model name",
                "pass --name with letters, digits, '_' or '-' (at most 64 characters)",
            )
        return name

    def validate(self) -> None:
        """Check option values that need no files; raise PipelineError on the first bad one."""
        if not 1 <= self.max_batch <= 4096:
            raise PipelineError(f"--max-batch {self.max_batch} is out of range", "use a value from 1 to 4096")
        if self.opset < 17:
            raise PipelineError(f"--opset {self.opset} is too old", "use --opset 17 or newer")
        if self.calibration_method not in CALIBRATION_METHODS:
            raise PipelineError(f"unknown --calibration-method '{self.calibration_method}'", f"use one of: {', '.join(CALIBRATION_METHODS)}")
        if self.version_policy not in ("new", "replace"):
            raise PipelineError(f"unknown --version-policy '{self.version_policy}'", "use new or replace")
        for text in self.shapes:
            if not well_formed(text):
                raise PipelineError(f"malformed --shape '{text}': expected {SHAPE_SYNTAX}", "write e.g. --shape image:1x8x8x1/32x8x8x1/64x8x8x1")
        if self.eval_data is not None and not self.eval_data.exists():
            raise PipelineError(f"evaluation data '{self.eval_data}' does not exist", "pass an .npz (or a folder of .npy files) with one array per input (and labels) to --eval-data")
        if self.int8 and self.calibration is not None and not self.calibration.exists():
            raise PipelineError(f"calibration data '{self.calibration}' does not exist", "pass an .npz file or a folder of .npy files or images to --calibration")
        for value, flag in ((self.gates.parity_atol, "--parity-atol"), (self.gates.fp16_max_drop, "--fp16-max-drop"), (self.gates.int8_max_drop, "--int8-max-drop")):
            if value < 0:
                raise PipelineError(f"{flag} {value} is negative", f"pass a non-negative {flag}")
