"""Apply a tune: show the config diff, and with ``--apply`` publish the best config.

Without ``--apply`` nothing is written to the repository. With it, the best config becomes a new
model version through the pipeline's atomic publish (the same model file, copied into the next
version folder; ``config.pbtxt`` and the pipeline's files swapped in with one rename, the
previous version kept). With ``--profile P`` the best config goes to ``configs/P.pbtxt`` instead
(Triton's custom model configuration, selected per MIG profile with ``--model-config-name``):
written beside, then renamed into place, and recorded as the pipeline's in ``.pipeline-owned.json``.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError, require
from pipeline.data.artifacts import VARIANT_NAME, Artifact
from pipeline.triton.config import config_text
from pipeline.tune.tuner import ModelTune


def config_path(profile: str | None) -> str:
    """The file the best config is compared with and written to."""
    if profile is None:
        return "config.pbtxt"
    from pipeline.mig.configs import config_relpath

    return config_relpath(profile)


def config_diff(job: ModelTune, profile: str | None) -> str:
    """Unified diff from the published config to the best one ('' when the published config won)."""
    best = job.config_of(job.best.candidate)
    name = f"{job.model}/{config_path(profile)}"
    old = config_text(job.published).splitlines(keepends=True)
    new = config_text(best).splitlines(keepends=True)
    return "".join(difflib.unified_diff(old, new, fromfile=f"{name} (published)", tofile=f"{name} (tuned)"))


def check_can_apply(job: ModelTune, profile: str | None, repository: Path) -> None:
    """Raise before any measurement when ``--apply`` could not write the result."""
    require(job.model_dir is not None, f"--apply writes into {repository}, which has no model '{job.model}'",
            "pass --repository with the local copy of the server's repository, or drop --apply")
    require(profile is not None or VARIANT_NAME.match(job.model) is not None,
            f"--apply publishes a new version only for models the pipeline published (<model>_<precision>), not '{job.model}'",
            f"drop --apply and copy the printed config into {job.model_dir}/config.pbtxt, or write it per profile with --profile")


def apply_best(job: ModelTune, repository: Path, profile: str | None, summary: dict[str, Any], reproduce: str) -> Path | None:
    """Publish the best config (new version, or ``configs/<profile>.pbtxt``); None when the
    published config is already the best."""
    require(job.model_dir is not None, f"--apply writes into a local repository, but {job.model} was tuned on a remote server",
            "run tune --apply on the machine holding the repository (or write the printed config yourself)")
    assert job.model_dir is not None
    best = job.best
    require(best.meets_slo, f"no candidate of {job.model} meets the SLO, so there is nothing to apply", "relax --slo-p99-ms")
    if best.candidate == job.base:
        return None
    config = job.config_of(best.candidate)
    if profile is not None:
        return _write_profile_config(job.model_dir, config_path(profile), config_text(config))
    return _publish_version(job, repository, config, summary, reproduce)


def _publish_version(job: ModelTune, repository: Path, config: Any, summary: dict[str, Any], reproduce: str) -> Path:
    from pipeline.triton.repository import OWNED, REPORT, model_filename, publish_repository

    assert job.model_dir is not None
    m = VARIANT_NAME.match(job.model)
    require(m is not None, f"model '{job.model}' was not published by the pipeline (names are <model>_<precision>)",
            f"copy the printed config into {job.model_dir}/config.pbtxt yourself, or use --profile")
    assert m is not None
    versions = sorted(int(p.name) for p in job.model_dir.iterdir() if p.is_dir() and p.name.isdigit() and not p.name.startswith("0"))
    source = job.model_dir / str(versions[-1]) / model_filename(config)
    artifact = Artifact(m["precision"], "plan" if m["trt"] else "onnx", source, _engine_metadata(job.model_dir, versions[-1], source))
    owned = json.loads((job.model_dir / OWNED).read_text()).get("files", []) if (job.model_dir / OWNED).is_file() else []
    # The publish keeps only the files it is given among those it owns: hand back labels, warmup samples, profile configs.
    extra = {rel: (job.model_dir / rel).read_bytes() for rel in owned
             if not rel.split("/", 1)[0].isdigit() and rel not in ("config.pbtxt", OWNED, REPORT) and (job.model_dir / rel).is_file()}
    previous = _previous_build(job.model_dir, versions[-1])
    try:
        published = publish_repository(
            [artifact], model=m["base"], repository=repository, configs={job.model: config}, extra_files={job.model: extra},
            version_policy="new", report={"tune": summary, "tuned_from_version": versions[-1], **previous}, reproduce=reproduce,
        )
    finally:
        if artifact.metadata is not None:
            artifact.metadata.unlink(missing_ok=True)
    return published[0]


def _engine_metadata(model_dir: Path, version: int, source: Path) -> Path | None:
    """A plan's engine metadata (recorded at publish) in a temporary file, for the new version's record."""
    if source.suffix != ".plan":
        return None
    from pipeline.triton.repository import REPORT

    try:
        meta = json.loads((model_dir / REPORT).read_text())["versions"][str(version)]["engine_metadata"]
    except (OSError, ValueError, KeyError):
        raise PipelineError(f"the publish record of {model_dir} has no engine metadata for version {version}",
                            "rebuild the engine with `python -m pipeline build`") from None
    import tempfile

    handle, name = tempfile.mkstemp(prefix="tune-engine-", suffix=".json")
    with os.fdopen(handle, "w") as fh:
        json.dump(meta, fh)
    return Path(name)


def _previous_build(model_dir: Path, version: int) -> dict[str, Any]:
    from pipeline.triton.repository import REPORT

    try:
        build = json.loads((model_dir / REPORT).read_text())["versions"][str(version)].get("build")
    except (OSError, ValueError, KeyError):
        return {}
    return {k: v for k, v in (build or {}).items() if k in ("accuracy", "manifest")}


def _write_profile_config(model_dir: Path, rel: str, text: str) -> Path:
    from pipeline.triton.config import parse_config
    from pipeline.triton.repository import OWNED

    parse_config(text)
    target = model_dir / rel
    owned_path = model_dir / OWNED
    record = json.loads(owned_path.read_text()) if owned_path.is_file() else {"versions": [], "files": []}
    require(not target.exists() or rel in record.get("files", []),
            f"{target} was not written by the pipeline", "move it away, or tune without --profile")
    if rel not in record.get("files", []):
        # Recorded first: a kill between the two renames leaves a listed file missing, which is harmless.
        record["files"] = sorted({*record.get("files", []), rel})
        _replace(owned_path, json.dumps(record, indent=2).encode())
    target.parent.mkdir(parents=True, exist_ok=True)
    _replace(target, text.encode())
    return target


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tune-tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
