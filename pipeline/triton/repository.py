"""Publish artifacts into a Triton model repository atomically, one model directory at a time.

A publish builds each complete new model directory in a staging folder beside the repository
(same filesystem, but outside it: Triton treats every directory inside the repository as a model),
then swaps it in with one ``renameat2(RENAME_EXCHANGE)`` (``RENAME_NOREPLACE`` for a new model) and
deletes the old copy. Killing the process at any moment leaves every model directory either fully
old or fully new; leftover staging folders are removed by the next publish.

The pipeline only deletes what it wrote: ``<model>/.pipeline-owned.json`` lists the versions and
files it wrote; anything else in a model directory is carried over untouched. Triton ignores both
hidden JSON files (only numeric sub-directories are versions; other files are not read unless the
config names them). ``<model>/.pipeline-report.json`` records, per version, the artifact, its hash,
the reproduce command and the build report.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import PipelineError, require
from pipeline.core.fingerprint import hash_path
from pipeline.core.pausepoints import pause_point
from pipeline.data.artifacts import Artifact
from pipeline.data.workspace import BUILD_REPORT
from pipeline.triton.config import (
    WARMUP_DIR,
    config_text,
    parse_config,
    warmup_input_bytes,
)
from pipeline.triton.fsops import (
    RENAME_EXCHANGE,
    RENAME_NOREPLACE,
    carry_over,
    copy_artifact,
    fsync,
    fsync_dirs,
    publish_lock,
    renameat2,
    write_synced,
)

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

CONFIG = "config.pbtxt"
OWNED = ".pipeline-owned.json"
REPORT = BUILD_REPORT  # beside each published model (pipeline.data.workspace)
POLICIES = ("new", "replace")
_RESERVED = (CONFIG, OWNED, REPORT)


@dataclass(frozen=True)
class PublishedModel:
    """One model of a repository as Triton will see it."""

    name: str
    path: Path
    versions: tuple[int, ...]
    config: ModelConfig


@dataclass(frozen=True)
class _Staged:
    name: str
    path: Path
    version: int


def publish_repository(
    artifacts: Sequence[Artifact],
    *,
    model: str,
    repository: Path,
    configs: Mapping[str, ModelConfig],
    extra_files: Mapping[str, Mapping[str, bytes]] | None = None,
    version_policy: str = "new",
    report: Mapping[str, Any] | None = None,
    reproduce: str = "python -m pipeline build",
) -> list[Path]:
    """Publish one Triton model per artifact (named ``artifact.triton_name(model)``); return the new version dirs.

    ``configs`` maps each Triton model name to its config (see :mod:`pipeline.triton.config`);
    ``extra_files`` maps it to ``{relative path: bytes}`` (``labels.txt``, ``warmup/*.bin``,
    ``configs/<profile>.pbtxt``). ``version_policy="new"`` adds the next integer version and keeps
    the others; ``"replace"`` serves only version 1 and removes the versions the pipeline wrote
    before (never versions it did not write). A model whose files would not change keeps its
    version (see :func:`_unchanged_version`); its current version dir is returned. All models are
    staged and checked before any is swapped in.
    """
    names = checked_request(artifacts, model, configs, extra_files or {}, version_policy)
    extra_files = extra_files or {}
    repository = Path(repository).absolute()
    repository.mkdir(parents=True, exist_ok=True)
    staging_root = repository.parent / f".{repository.name}.pipeline-staging"
    with publish_lock(repository):
        _remove_staging(staging_root)
        staging_root.mkdir()
        require(
            os.stat(staging_root).st_dev == os.stat(repository).st_dev,
            f"{repository} is on another filesystem than its parent {repository.parent}, so it cannot be updated atomically",
            "use a repository folder that is not itself a mount point (mount its parent instead)",
        )
        published: dict[str, Path] = {}
        try:
            staged = []
            for artifact, name in zip(artifacts, names):
                kept = _unchanged_version(repository / name, artifact, configs[name], extra_files.get(name, {}), version_policy)
                if kept is not None:
                    log.info("%s unchanged: keeps serving version %d", name, kept)
                    published[name] = repository / name / str(kept)
                    continue
                staged.append(_stage_model(artifact, name, repository, staging_root, configs[name], extra_files.get(name, {}), version_policy, report, reproduce))
            for item in staged:
                pause_point("publish.swap")  # tests hold the publish here to kill it (pipeline/core/pausepoints.py)
                _swap_in(item, repository / item.name)
                published[item.name] = repository / item.name / str(item.version)
                log.info("published %s version %d", item.name, item.version)
        finally:
            _remove_staging(staging_root)
    return [published[name] for name in names]


def checked_request(artifacts: Sequence[Artifact], model: str, configs: Mapping[str, ModelConfig],
                    extra_files: Mapping[str, Mapping[str, bytes]], version_policy: str) -> list[str]:
    """The Triton model names of a publish of ``artifacts``; PipelineError when the request is inconsistent
    (unknown policy, no or clashing artifacts, extra files or configs that do not match them, bad extra paths)."""
    require(version_policy in POLICIES, f"unknown version policy '{version_policy}'", "use 'new' or 'replace'")
    names = [a.triton_name(model) for a in artifacts]
    require(bool(names), "there are no artifacts to publish", "build at least one model variant first")
    require(len(set(names)) == len(names), f"two artifacts map to the same Triton model: {names}", "publish one artifact per precision and kind")
    unknown = sorted(set(extra_files) - set(names))
    require(not unknown, f"extra files for models {unknown} that are not being published", f"key extra_files by {', '.join(names)}")
    for name in names:
        require(name in configs, f"no config for Triton model '{name}'", "build one with pipeline.triton.config.model_config_from_artifact")
        require(configs[name].name == name, f"config for '{name}' is named '{configs[name].name}'", "Triton needs the config name to equal the model directory name")
        for rel in extra_files.get(name, {}):
            _check_relative(rel, name)
    return names


def _unchanged_version(current: Path, artifact: Artifact, cfg: ModelConfig, files: Mapping[str, bytes], policy: str) -> int | None:
    """The version Triton serves of ``current`` if publishing would change nothing, else None.

    Unchanged means: the newest version is one the pipeline wrote from an artifact with the same
    SHA-256, with the same config text, and the model's other files (labels, warmup samples,
    per-profile configs) are byte-identical with nothing to add or remove; for policy ``replace``
    also that version 1 is the only version the pipeline serves there. A rebuild that only changed
    INT8 then leaves FP32/FP16 at their version instead of republishing identical copies.
    """
    if not (current / REPORT).is_file():
        return None
    owned_versions, owned_files = _read_owned(current)
    existing = _versions(current)
    if not existing or max(existing) not in owned_versions:
        return None
    if policy == "replace" and owned_versions & existing != {1}:
        return None
    try:
        entry = json.loads((current / REPORT).read_text())["versions"][str(max(existing))]
        same = (entry["artifact"]["sha256"] == hash_path(Path(artifact.path))
                and entry["config_sha256"] == hashlib.sha256(config_text(cfg).encode()).hexdigest())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    extras = {rel for rel in owned_files if not rel.split("/", 1)[0].isdigit()} - {CONFIG}
    if not same or extras != set(files) or (current / CONFIG).read_bytes() != config_text(cfg).encode():
        return None
    if any(not (current / rel).is_file() or (current / rel).read_bytes() != data for rel, data in files.items()):
        return None
    return max(existing)


def read_repository(repository: Path) -> dict[str, PublishedModel]:
    """The models of a repository (name → versions and parsed config); PipelineError if missing, empty or broken."""
    fix = "run `python -m pipeline build` first"
    models: dict[str, PublishedModel] = {}
    for path in model_dirs(repository):
        config_path = path / CONFIG
        require(config_path.is_file(), f"model directory {path} has no {CONFIG}", fix)
        config = parse_config(config_path.read_text(), str(config_path))
        require(config.name in ("", path.name), f"{config_path} names model '{config.name}', not '{path.name}'", fix)
        config.name = path.name
        versions = _versions(path)
        require(bool(versions), f"model {path.name} in {repository} has no numeric version directory", fix)
        models[path.name] = PublishedModel(path.name, path, tuple(sorted(versions)), config)
    return models


def model_dirs(repository: Path) -> list[Path]:
    """The model directories of a repository as Triton sees them (hidden folders are not models);
    PipelineError if the repository is missing or empty."""
    repository = Path(repository)
    fix = "build it first: python -m pipeline build (or pass --repository)"
    require(repository.is_dir(), f"the model repository {repository} does not exist", fix)
    dirs = sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
    require(bool(dirs), f"the model repository {repository} has no models", fix)
    return dirs


def _stage_model(
    artifact: Artifact, name: str, repository: Path, staging_root: Path, cfg: ModelConfig,
    files: Mapping[str, bytes], policy: str, report: Mapping[str, Any] | None, reproduce: str,
) -> _Staged:
    current = repository / name
    require(not current.exists() or current.is_dir(), f"{current} exists but is not a directory", "move it out of the model repository")
    require(Path(artifact.path).exists(), f"artifact {artifact.path} does not exist", "rebuild it")
    owned_versions, owned_files = _read_owned(current)
    existing = _versions(current) if current.is_dir() else set()
    for rel in files:
        _check_relative(rel, name)

    if policy == "new":
        version, dropped = max(existing, default=0) + 1, set()
    else:
        require(1 not in existing or 1 in owned_versions, f"{current}/1 was not written by the pipeline, so policy 'replace' cannot overwrite it", "move it away, or publish with version policy 'new'")
        version, dropped = 1, owned_versions & existing
        newer = sorted(existing - owned_versions - {1})
        if newer:
            log.warning("%s keeps versions %s the pipeline did not write; Triton serves the newest of them, not version 1", current, newer)
    new_files = {CONFIG: config_text(cfg).encode(), **files}
    skipped = {rel for rel in owned_files if not rel.split("/", 1)[0].isdigit()} | set(new_files)
    for rel in new_files:
        require(not (current / rel).exists() or rel in owned_files, f"{current / rel} was not written by the pipeline", "move or rename it; the pipeline never overwrites files it did not write")
    for v in sorted(dropped):
        foreign = [p for p in _files_under(current / str(v), current) if p not in owned_files]
        require(not foreign, f"{current}/{v} holds files the pipeline did not write ({', '.join(foreign[:3])})", f"move them out of {current}/{v}, then publish again")

    stage = staging_root / f"{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    stage.mkdir()
    if current.is_dir():
        carry_over(current, stage, "", skip_files=skipped | set(_RESERVED), skip_dirs={str(v) for v in dropped})
    model_file = stage / str(version) / model_filename(cfg)
    require(not model_file.parent.exists(), f"{current}/{version} exists but is not a version the pipeline can replace", "move it out of the model directory")
    model_file.parent.mkdir()
    if cfg.platform != "ensemble":  # an ensemble's version folder stays empty
        copy_artifact(Path(artifact.path), model_file)
    for rel, data in sorted(files.items()):
        write_synced(stage / rel, data)
    write_synced(stage / CONFIG, new_files[CONFIG])  # after the model files: a config never points at missing files

    kept = (owned_versions - dropped) & existing
    version_files = {p for p in owned_files if p.split("/", 1)[0].isdigit() and int(p.split("/", 1)[0]) in kept}
    owned = {"versions": sorted(kept | {version}), "files": sorted(version_files | set(new_files) | set(_files_under(model_file, stage)))}
    write_synced(stage / OWNED, json.dumps(owned, indent=2).encode())
    write_synced(stage / REPORT, json.dumps(version_report(_previous_report(current), kept, version, name, artifact, cfg, report, reproduce),
                                            indent=2, default=str).encode())
    check_staged(stage, cfg)
    fsync_dirs(stage)
    return _Staged(name, stage, version)


def model_filename(cfg: ModelConfig) -> str:
    """The file (or folder) Triton loads from each version directory of ``cfg``'s model."""
    plan = cfg.platform == "tensorrt_plan" or cfg.backend == "tensorrt"
    return cfg.default_model_filename or ("model.plan" if plan else "model.onnx")


def _swap_in(item: _Staged, target: Path) -> None:
    if target.is_dir():
        renameat2(item.path, target, RENAME_EXCHANGE)  # item.path now holds the old model dir
        shutil.rmtree(item.path)
    else:
        renameat2(item.path, target, RENAME_NOREPLACE)
    fsync(target.parent)


def _remove_staging(root: Path) -> None:
    if root.is_dir():
        for leftover in root.iterdir():
            log.info("removing leftover staging folder %s", leftover)
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
        root.rmdir()


def _read_owned(model_dir: Path) -> tuple[set[int], set[str]]:
    path = model_dir / OWNED
    if not path.is_file():
        return set(), set()
    try:
        record = json.loads(path.read_text())
        return {int(v) for v in record["versions"]}, {str(f) for f in record["files"]}
    except (ValueError, KeyError, TypeError):
        raise PipelineError(
            f"{path} is unreadable, so the pipeline cannot tell its files from yours",
            f"restore it, or move {model_dir} out of the repository and publish again",
        ) from None


def model_versions(model_dir: Path) -> list[int]:
    """The version numbers Triton sees in a model directory, ascending."""
    return sorted(_versions(Path(model_dir)))


def _versions(model_dir: Path) -> set[int]:
    # Triton's rule: numeric sub-directories not starting with "0" are versions.
    return {int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and not p.name.startswith("0")}


def _check_relative(rel: str, name: str) -> None:
    parts = rel.split("/")
    require(
        bool(rel) and not rel.startswith("/") and "\\" not in rel and all(p not in ("", ".", "..") for p in parts),
        f"extra file path '{rel}' of model '{name}' is not a plain relative path", "use paths like labels.txt or warmup/image.bin",
    )
    require(not parts[0].isdigit(), f"extra file '{rel}' of model '{name}' would sit in a version directory", "keep extra files outside numeric folders")
    require(rel not in _RESERVED, f"extra file '{rel}' of model '{name}' is written by the pipeline itself", "drop it from extra_files")


def _files_under(path: Path, root: Path) -> list[str]:
    if not path.is_dir():
        return [path.relative_to(root).as_posix()] if path.exists() else []
    return sorted(p.relative_to(root).as_posix() for p in path.rglob("*") if not p.is_dir() or p.is_symlink())


def check_staged(stage: Path, cfg: ModelConfig) -> None:
    """The staged directory must load in Triton: config parses, every version has its model file,
    and files the config names (labels, warmup samples of the right size) exist."""
    parsed = parse_config((stage / CONFIG).read_text())
    require(parsed == cfg, f"{CONFIG} of '{cfg.name}' does not read back as written", "report this as a bug")
    filename = model_filename(cfg)
    for version in _versions(stage) if cfg.platform != "ensemble" else ():
        require((stage / str(version) / filename).exists(), f"version {version} of '{cfg.name}' has no {filename}", f"add {filename} to it or remove the version folder")
    custom = stage / "configs"
    for path in sorted(custom.glob("*.pbtxt")) if custom.is_dir() else []:
        # Triton loads these with --model-config-name (per MIG profile): they must parse and name this model.
        other = parse_config(path.read_text())
        require(other.name in ("", cfg.name), f"{path.name} of '{cfg.name}' names model '{other.name}'", "build per-profile configs from this model's config")
    for output in cfg.output:
        if output.label_filename:
            require((stage / output.label_filename).is_file(), f"config of '{cfg.name}' names labels file {output.label_filename}, which is not published", "pass it in extra_files")
    for sample in cfg.model_warmup:
        for input_name, spec in sample.inputs.items():
            if spec.WhichOneof("input_data_type") != "input_data_file":
                continue
            path = stage / WARMUP_DIR / spec.input_data_file
            require(path.is_file(), f"warmup sample {WARMUP_DIR}/{spec.input_data_file} of '{cfg.name}' is not published", "pass the warmup_files(...) output in extra_files")
            want, got = warmup_input_bytes(spec), path.stat().st_size
            require(want is None or got == want, f"warmup sample {path.name} of '{cfg.name}' input '{input_name}' has {got} bytes, its dims {list(spec.dims)} need {want}", "regenerate it with warmup_files(...)")


def _previous_report(current: Path) -> dict[str, Any]:
    if (current / REPORT).is_file():
        try:
            return dict(json.loads((current / REPORT).read_text()).get("versions", {}))
        except (ValueError, AttributeError, TypeError):
            log.warning("ignoring unreadable %s", current / REPORT)
    return {}


def version_report(previous: Mapping[str, Any], kept: set[int], version: int, name: str, artifact: Artifact, cfg: ModelConfig,
                   report: Mapping[str, Any] | None, reproduce: str) -> dict[str, Any]:
    """The model's ``.pipeline-report.json``: the entries of ``previous`` (version → entry) for the ``kept``
    versions, and this publish's entry for ``version``."""
    entry: dict[str, Any] = {
        "published": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "artifact": {"precision": artifact.precision, "kind": artifact.kind, "source": str(artifact.path), "sha256": hash_path(Path(artifact.path))},
        "config_sha256": hashlib.sha256(config_text(cfg).encode()).hexdigest(),
        "reproduce": reproduce,
        "build": dict(report) if report is not None else None,
    }
    if artifact.metadata is not None and Path(artifact.metadata).is_file():
        try:
            entry["engine_metadata"] = json.loads(Path(artifact.metadata).read_text())
        except ValueError:
            entry["engine_metadata"] = None
    versions = {v: previous[v] for v in previous if v.isdigit() and int(v) in kept}
    versions[str(version)] = entry
    return {"model": name, "versions": dict(sorted(versions.items(), key=lambda kv: int(kv[0])))}

