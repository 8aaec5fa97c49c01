"""Run a stage or skip it: a stage is skipped only when the hash of its inputs and settings
matches the one recorded beside its outputs. Every run (or skip) is recorded in the manifest."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.core.atomic import write_text_atomic
from pipeline.core.fingerprint import code_hash, hash_path, hash_settings
from pipeline.core.onnx_files import onnx_files

log = logging.getLogger(__name__)


@dataclass
class StageRecord:
    """What one stage did in one build."""

    name: str
    status: str  # "ran" | "skipped" (inputs and settings unchanged) | "not run" (with a reason) | "failed"
    seconds: float  # this build's time on it (for a skip: the time to check the key)
    key: str = ""
    inputs: dict[str, str] = field(default_factory=dict)  # path -> sha256
    outputs: list[str] = field(default_factory=list)
    note: str = ""
    # The run that produced the outputs: when it finished and how long it took (this run's, or for a
    # skip the recorded one's, read from the sidecar; None/"" for a stage that did not run).
    ran_seconds: float | None = None
    ran_at: str = ""


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
        write_text_atomic(self.path, json.dumps(data, indent=2, default=str) + "\n")
        return self.path

    def ran(self, name: str, seconds: float, note: str = "") -> None:
        """Record a stage that always runs (it checks something outside the workdir, e.g. a server)."""
        self.stages.append(StageRecord(name, "ran", seconds, note=note, ran_seconds=round(seconds, 3), ran_at=now()))

    def not_run(self, name: str, reason: str) -> None:
        """Record a stage that could not run here (e.g. TensorRT missing)."""
        self.stages.append(StageRecord(name, "not run", 0.0, note=reason))


def now() -> str:
    """The local time, to the second, with its UTC offset (when a stage ran)."""
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _sidecar(output: Path) -> Path:
    return output.with_name(output.name + ".stage.json")


@dataclass(frozen=True)
class Stage:
    """One stage call, described once: the function and its keyword arguments, split by how the
    cache treats them. The same mappings are hashed for the key and passed to ``fn``, so the key
    cannot go stale against the call.

    - ``inputs``: files/folders (hashed by content), objects with a ``fingerprint`` (attribute or
      method, e.g. evaluation data), strings (taken as hashes), or lists of those;
    - ``settings``: values hashed as they are (dataclasses by their fields);
    - ``outputs``: where it writes; the first gets the ``<output>.stage.json`` sidecar;
    - ``context``: passed but not keyed, because it is derived from the inputs (e.g. the model's
      signature) or only speeds the stage up (e.g. a timing cache);
    - ``environment``: keyed but not passed (e.g. the GPU an engine is built for);
    - ``also_writes``: further outputs that must exist for a skip (not passed).
    """

    name: str
    fn: Callable[..., Any]
    inputs: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    outputs: Mapping[str, Path] = field(default_factory=dict)
    context: Mapping[str, Any] = field(default_factory=dict)
    environment: Mapping[str, Any] = field(default_factory=dict)
    also_writes: Sequence[Path] = ()

    def output_paths(self) -> list[Path]:
        return [*self.outputs.values(), *self.also_writes]

    def call(self) -> Any:
        return self.fn(**self.inputs, **self.outputs, **self.settings, **self.context)


def input_hash(value: Any) -> str:
    """The content hash of one stage input (see :class:`Stage`)."""
    if isinstance(value, Path):
        return hash_path(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return hash_settings([input_hash(v) for v in value])
    fingerprint = getattr(value, "fingerprint", None)
    if fingerprint is None:
        raise TypeError(f"stage input of type {type(value).__name__} has no fingerprint")
    return str(fingerprint() if callable(fingerprint) else fingerprint)


def _settings_json(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {k: asdict(v) if is_dataclass(v) and not isinstance(v, type) else v for k, v in settings.items()}


def run_stage(manifest: Manifest, stage: Stage, reproduce: str, *, isolated: bool = False) -> bool:
    """Run ``stage`` unless every output exists and its recorded key equals the hash of its
    inputs, settings and environment (with the tool versions and the pipeline version).
    ``isolated`` runs it in a child process (:func:`pipeline.core.isolate.call_in_child`): what it
    allocates leaves with it, so one stage's peak memory is not added to the next one's.

    Beside the first output a ``<output>.stage.json`` holds the key, the settings, the input
    hashes and the command that reproduces it. Returns True when the stage ran.
    """
    started = time.perf_counter()
    name = stage.name
    input_hashes = {k: input_hash(v) for k, v in stage.inputs.items()}
    settings = {**_settings_json(stage.settings), **_settings_json(stage.environment)}
    # Tool versions are part of the key: a new tf2onnx or ONNX Runtime must not reuse old artifacts.
    # So are the pipeline's own sources (code_hash): an upgrade must not reuse artifacts or verdicts of the old code.
    key = hash_settings({"stage": name, "version": __version__, "code": code_hash(), "tools": manifest.versions, "inputs": input_hashes,
                         "settings": settings})
    outputs = stage.output_paths()
    sidecar = _sidecar(outputs[0])
    if all(f.exists() for p in outputs for f in onnx_files(p)) and sidecar.exists():  # an ONNX output with its data files
        try:
            recorded = json.loads(sidecar.read_text())
        except (OSError, ValueError):
            recorded = {}
        if isinstance(recorded, dict) and recorded.get("key") == key:
            seconds = time.perf_counter() - started
            ran_seconds = recorded.get("seconds")
            manifest.stages.append(StageRecord(name, "skipped", seconds, key, input_hashes, [str(p) for p in outputs],
                                               ran_seconds=float(ran_seconds) if isinstance(ran_seconds, (int, float)) else None,
                                               ran_at=str(recorded.get("finished") or "")))
            log.info("%-10s skipped (inputs and settings unchanged)", name)
            return False
    sidecar.unlink(missing_ok=True)  # a stage killed midway must not look finished
    log.info("%-10s running…", name)
    try:
        if isolated:
            from pipeline.core.isolate import call_in_child

            call_in_child(stage.fn, **stage.inputs, **stage.outputs, **stage.settings, **stage.context)
        else:
            stage.call()
    except Exception as exc:
        manifest.stages.append(StageRecord(name, "failed", time.perf_counter() - started, key, input_hashes, note=str(exc)))
        raise
    seconds = time.perf_counter() - started
    finished = now()
    record: dict[str, Any] = {"stage": name, "key": key, "inputs": input_hashes, "settings": settings, "reproduce": reproduce, "seconds": round(seconds, 3),
              "finished": finished}
    write_text_atomic(sidecar, json.dumps(record, indent=2, default=str) + "\n")
    manifest.stages.append(StageRecord(name, "ran", seconds, key, input_hashes, [str(p) for p in outputs],
                                       ran_seconds=record["seconds"], ran_at=finished))  # as the sidecar keeps it for later skips
    log.info("%-10s done in %.1f s", name, seconds)
    return True
