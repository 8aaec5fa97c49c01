"""Where things live on disk: a model's build workspace and its data folder (one place for each layout)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workspace:
    """Where one model's build artifacts live: ``<workdir>/<name>/``."""

    root: Path

    @property
    def savedmodel(self) -> Path:
        return self.root / "savedmodel"

    def onnx(self, precision: str) -> Path:
        return self.root / f"model.{precision}.onnx"

    def fallback_record(self, precision: str) -> Path:
        """What the INT8 fallback tried and kept in float for ``precision`` (pipeline.stages.int8_fallback)."""
        return self.root / f"{precision}.fallback.json"

    def plan(self, precision: str) -> Path:
        return self.root / "engines" / f"model.{precision}.plan"

    @property
    def timing_cache(self) -> Path:
        return self.root / "engines" / "timing.cache"

    @property
    def parity(self) -> Path:
        return self.root / "parity.json"

    @property
    def uint8_parity(self) -> Path:
        return self.root / "uint8_parity.json"

    @property
    def accuracy(self) -> Path:
        return self.root / "accuracy.json"

    @property
    def latency(self) -> Path:
        return self.root / "latency.json"

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
class ModelData:
    """One model's data folder, ``<calibration-root>/<name>/``.

    | file | what |
    | --- | --- |
    | ``eval.npz`` | labeled evaluation split: one array per input name (first axis = sample) + ``labels`` |
    | ``calib.npz`` | calibration split: one array per input name (or ``<input>.npy`` files, or images) |
    | ``labels.txt`` | class names, one per line, for Triton's classification extension |
    """

    folder: Path

    EVAL = "eval.npz"
    CALIB = "calib.npz"
    LABELS = "labels.txt"

    @classmethod
    def of(cls, calibration_root: Path, model: str) -> ModelData:
        """The data folder of ``model`` under ``calibration_root``."""
        return cls(Path(calibration_root) / model)

    @property
    def eval(self) -> Path:
        return self.folder / self.EVAL

    @property
    def calib(self) -> Path:
        return self.folder / self.CALIB

    @property
    def labels(self) -> Path:
        return self.folder / self.LABELS

    def complete(self) -> bool:
        """All three files are there."""
        return all(p.is_file() for p in (self.eval, self.calib, self.labels))


def bundled_model_data(calibration_root: Path, default_root: Path, workdir: Path, name: str) -> ModelData:
    """Where the bundled model's data is read, or generated when missing: ``calibration_root`` when it
    already holds the data or was chosen (not ``default_root``), or when it is the source tree's
    ``calibration/`` (the build runs in the checkout the package lives in); else ``<workdir>/calibration``,
    so a build run from another directory writes only under its workdir, never into the current one."""
    given = ModelData.of(calibration_root, name)
    source_tree = Path(__file__).resolve().parents[2] / default_root
    if given.complete() or Path(calibration_root) != Path(default_root) or Path(calibration_root).resolve() == source_tree:
        return given
    return ModelData.of(Path(workdir) / default_root, name)


BUILD_REPORT = ".pipeline-report.json"  # beside each published model: per version, the build that made it


def build_record_of_served(model_dir: Path) -> dict:
    """What the build of a served model's newest version recorded (``<model>/.pipeline-report.json``):
    its evaluation data, output kinds and gates; empty for models the pipeline did not build."""
    import json

    report = Path(model_dir) / BUILD_REPORT
    if not report.is_file():
        return {}
    try:
        versions = json.loads(report.read_text()).get("versions", {})
        newest = versions[max(versions, key=int)] if versions else {}
        return dict(newest.get("build") or {})
    except (ValueError, AttributeError, TypeError):
        return {}


def eval_data_of_served(model_dir: Path, calibration_root: Path) -> Path | None:
    """The evaluation data for a served model: what its newest build recorded
    (``<model>/.pipeline-report.json``), else ``<calibration-root>/<base model>/eval.npz``; None if neither exists."""
    from pipeline.data.artifacts import parse_variant

    recorded = build_record_of_served(model_dir).get("eval_data")
    if recorded and Path(recorded).is_file():
        return Path(recorded)
    name = Path(model_dir).name
    base = (parse_variant(name) or (name, ""))[0]
    for candidate in (ModelData.of(calibration_root, name).eval, ModelData.of(calibration_root, base).eval):
        if candidate.is_file():
            return candidate
    return None
