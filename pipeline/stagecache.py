"""Run a stage or skip it: a stage is skipped only when the hash of its inputs and settings
matches the one recorded beside its outputs. Every run (or skip) is recorded in the manifest."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.fingerprint import hash_path, hash_settings

log = logging.getLogger(__name__)


@dataclass
class StageRecord:
    """What one stage did in one build."""

    name: str
    status: str  # "ran" | "skipped" (inputs and settings unchanged) | "not run" (with a reason) | "failed"
    seconds: float
    key: str = ""
    inputs: dict[str, str] = field(default_factory=dict)  # path -> sha256
    outputs: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Manifest:
    """The workdir's record of a build: tool versions, input hashes, stage timings, artifacts."""

    path: Path
    command: str
    versions: dict[str, str] = field(default_factory=dict)
    stages: list[StageRecord] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)

    def write(self) -> Path:
        """Write the manifest JSON atomically."""
        data = {
            "pipeline_version": __version__,
            "command": self.command,
            "versions": self.versions,
            "stages": [asdict(s) for s in self.stages],
            "artifacts": self.artifacts,
            "results": self.results,
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        tmp.replace(self.path)
        return self.path

    def ran(self, name: str, seconds: float, note: str = "") -> None:
        """Record a stage that always runs (it checks something outside the workdir, e.g. a server)."""
        self.stages.append(StageRecord(name, "ran", seconds, note=note))

    def not_run(self, name: str, reason: str) -> None:
        """Record a stage that could not run here (e.g. TensorRT missing)."""
        self.stages.append(StageRecord(name, "not run", 0.0, note=reason))


def _sidecar(output: Path) -> Path:
    return output.with_name(output.name + ".stage.json")


def run_stage(
    manifest: Manifest,
    name: str,
    *,
    inputs: Mapping[str, Path | str],
    settings: Mapping[str, Any],
    outputs: Sequence[Path],
    produce: Callable[[], Any],
    reproduce: str,
) -> bool:
    """Run ``produce`` unless every output exists and its recorded key equals the hash of
    ``inputs`` (files/folders are hashed; strings are taken as hashes already) and ``settings``.

    Beside the first output a ``<output>.stage.json`` holds the key, the settings, the input
    hashes and the command that reproduces it. Returns True when the stage ran.
    """
    started = time.perf_counter()
    input_hashes = {k: (v if isinstance(v, str) else hash_path(v)) for k, v in inputs.items()}
    # Tool versions are part of the key: a new tf2onnx or ONNX Runtime must not reuse old artifacts.
    key = hash_settings({"stage": name, "version": __version__, "tools": manifest.versions, "inputs": input_hashes, "settings": settings})
    sidecar = _sidecar(outputs[0])
    if all(p.exists() for p in outputs) and sidecar.exists():
        try:
            recorded = json.loads(sidecar.read_text()).get("key")
        except (OSError, ValueError):
            recorded = None
        if recorded == key:
            seconds = time.perf_counter() - started
            manifest.stages.append(StageRecord(name, "skipped", seconds, key, input_hashes, [str(p) for p in outputs]))
            log.info("%-10s skipped (inputs and settings unchanged)", name)
            return False
    sidecar.unlink(missing_ok=True)  # a stage killed midway must not look finished
    log.info("%-10s running…", name)
    try:
        produce()
    except Exception as exc:
        manifest.stages.append(StageRecord(name, "failed", time.perf_counter() - started, key, input_hashes, note=str(exc)))
        raise
    seconds = time.perf_counter() - started
    sidecar.write_text(
        json.dumps(
            {"stage": name, "key": key, "inputs": input_hashes, "settings": settings, "reproduce": reproduce, "seconds": round(seconds, 3)},
            indent=2,
            default=str,
        )
        + "\n"
    )
    manifest.stages.append(StageRecord(name, "ran", seconds, key, input_hashes, [str(p) for p in outputs]))
    log.info("%-10s done in %.1f s", name, seconds)
    return True
