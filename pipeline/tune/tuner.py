"""The tune loop: for each model, the published config first, then the search policy's proposals,
each measured on the target (or taken from the trial cache), within the trial and time budget."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import PipelineError, require
from pipeline.core.fingerprint import hash_path, hash_settings
from pipeline.core.options import CALIBRATION_ROOT, DEFAULT_REPOSITORY
from pipeline.loadtest import payload as pl
from pipeline.tune.cache import TrialCache, trial_key
from pipeline.tune.gpu_memory import MemoryMeter
from pipeline.tune.policy import search_policy
from pipeline.tune.space import (
    Candidate,
    SearchSpace,
    batch_limit,
    candidate_from_config,
    config_for_candidate,
    config_json,
    search_space,
)
from pipeline.tune.targets import Target
from pipeline.tune.trial import Requests, Trial, TrialSettings, memory_meter, run_trial

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

RECOMMEND_GAIN = 0.05  # run-to-run spread of one trial on a quiet machine is a few percent


@dataclass(frozen=True)
class SpaceOptions:
    """The ``--instances/--max-batch/--preferred/--queue-delay-us`` overrides (None: defaults)."""

    instances: str | None = None
    max_batch: str | None = None
    preferred: str | None = None
    queue_delay_us: str | None = None


@dataclass(frozen=True)
class TuneSettings:
    """Everything one tune run needs besides the target."""

    models: tuple[str, ...]
    trial: TrialSettings
    repository: Path = DEFAULT_REPOSITORY
    search: str = "quick"
    max_trials: int = 8
    max_minutes: float = 30.0
    space: SpaceOptions = field(default_factory=SpaceOptions)
    cache_path: Path = Path("build/tune/trials.jsonl")
    fresh: bool = False
    profile: str | None = None
    calibration_root: Path = CALIBRATION_ROOT
    data: Path | None = None


@dataclass
class ModelTune:
    """The tuning of one model: its published config, the space, and every trial in order."""

    model: str
    published: ModelConfig
    base: Candidate
    space: SearchSpace
    model_dir: Path | None
    trials: list[Trial] = field(default_factory=list)
    stopped: str = ""
    seconds: float = 0.0

    @property
    def baseline(self) -> Trial:
        """The trial of the published config (always the first)."""
        return next(t for t in self.trials if t.baseline)

    @property
    def best(self) -> Trial:
        """The highest throughput under the SLO (the closest candidate when none met it). A
        candidate must beat a published config that meets the SLO by more than RECOMMEND_GAIN,
        so measurement noise never recommends a change."""
        top = max(self.trials, key=lambda t: (t.score, t.baseline))
        base = next((t for t in self.trials if t.baseline), None)
        if base is not None and base.meets_slo and top.score <= base.score * (1 + RECOMMEND_GAIN):
            return base
        return top

    def config_of(self, candidate: Candidate) -> ModelConfig:
        """The full config a candidate is loaded with (the published one itself for the published candidate)."""
        return self.published if candidate == self.base else config_for_candidate(self.published, candidate)


Progress = Callable[[ModelTune, Trial, int], None]


def published_config(settings: TuneSettings, remote: Target | None, model: str) -> tuple[ModelConfig, Path | None]:
    """The config the model is published with (the profile's, with --profile) and its local directory.

    Embedded: read from the repository; remote: asked from the server (its files are not ours;
    the local directory is the one in --repository, if it has the model, for --apply)."""
    from pipeline.triton.config import parse_config

    model_dir = settings.repository / model
    if remote is not None:
        return remote.model_config(model), model_dir if (model_dir / "config.pbtxt").is_file() else None
    require((model_dir / "config.pbtxt").is_file(), f"model '{model}' is not in the repository {settings.repository}",
            f"pass one of its models with --model ({', '.join(_models_in(settings.repository)) or 'none'}), "
            "or build it: python -m pipeline build")
    path = model_dir / "config.pbtxt"
    if settings.profile and (model_dir / "configs" / f"{settings.profile}.pbtxt").is_file():
        path = model_dir / "configs" / f"{settings.profile}.pbtxt"
    cfg = parse_config(path.read_text())
    cfg.name = cfg.name or model
    return cfg, model_dir


def _models_in(repository: Path) -> list[str]:
    return sorted(p.parent.name for p in Path(repository).glob("*/config.pbtxt")) if Path(repository).is_dir() else []


def prepare(settings: TuneSettings, remote: Target | None, model: str) -> ModelTune:
    """Published config and search space of one model (raises on bad input); ``remote`` is the
    --url target (None: the embedded server, which need not run yet)."""
    cfg, model_dir = published_config(settings, remote, model)
    base = candidate_from_config(cfg)
    limit = batch_limit(model_dir, cfg) if model_dir is not None and remote is None else cfg.max_batch_size
    space = search_space(base, limit, instances=settings.space.instances, max_batch=settings.space.max_batch,
                         preferred=settings.space.preferred, queue_delay_us=settings.space.queue_delay_us, model=model)
    if remote is None:
        require(cfg.platform != "tensorrt_plan" and cfg.backend != "tensorrt",
                f"model '{model}' is a TensorRT plan, which the embedded CPU server cannot load",
                "tune it on a GPU server: start Triton there in explicit mode and pass --url HOST:PORT")
    return ModelTune(model, cfg, base, space, model_dir)


def tune_model(settings: TuneSettings, target: Target, job: ModelTune, cache: TrialCache, progress: Progress) -> ModelTune:
    """Measure the published config, then follow the search policy within the budget."""
    began = time.monotonic()
    model_hash = _model_hash(target, job)
    samples = settings.data or pl.eval_data_path(job.model, settings.calibration_root, settings.repository)
    requests: Requests | None = None
    meter: MemoryMeter | None = None
    policy = search_policy(settings.search, job.space, job.base)
    scores: dict[Candidate, float] = {}
    load_policy = {**settings.trial.to_dict(), "samples": hash_path(Path(samples))}  # other requests measure something else
    try:
        while True:
            if len(job.trials) >= settings.max_trials:
                job.stopped = f"--max-trials {settings.max_trials} reached"
                break
            if time.monotonic() - began > settings.max_minutes * 60:
                job.stopped = f"--max-minutes {settings.max_minutes:g} reached"
                break
            candidate = policy.propose(scores)
            if candidate is None:
                job.stopped = "search finished (no neighbour improves)" if settings.search == "quick" else "grid exhausted"
                break
            config = job.config_of(candidate)
            key = trial_key(model_hash, config_json(config), load_policy, target.identity)
            cached = cache.get(key)
            if cached is not None:
                trial = Trial.from_dict(cached, settings.trial)
                trial.baseline = candidate == job.base
            else:
                if requests is None:
                    requests = Requests(target, job.model, job.published.max_batch_size, samples)
                    meter = memory_meter(target)  # the target has started now
                log.info("%s: trial %d: %s", job.model, len(job.trials) + 1, candidate.label)
                trial = run_trial(target, job.model, config, candidate, requests, settings.trial, baseline=candidate == job.base,
                                  meter=meter)
                cache.put(key, trial.to_dict())
            job.trials.append(trial)
            scores[candidate] = trial.score
            progress(job, trial, len(job.trials))
    finally:
        if requests is not None:
            _restore(target, job)
    job.seconds = time.monotonic() - began
    return job


def _restore(target: Target, job: ModelTune) -> None:
    """Put the published config back (a remote server keeps serving what it served before)."""
    try:
        target.load(job.model, job.published)
    except Exception as exc:  # the tune's result stands; say what the server is left with
        log.warning("could not restore the published config of %s on %s: %s", job.model, target.endpoint.address, exc)


def _model_hash(target: Target, job: ModelTune) -> str:
    """The served model file's hash (embedded), or the server's description of the model (remote)."""
    from pipeline.triton.repository import model_filename

    if target.identity.get("kind") != "remote" and job.model_dir is not None:
        versions = sorted(int(p.name) for p in job.model_dir.iterdir() if p.is_dir() and p.name.isdigit() and not p.name.startswith("0"))
        require(bool(versions), f"model '{job.model}' has no version in {job.model_dir}", "rebuild it")
        return hash_path(job.model_dir / str(versions[-1]) / model_filename(job.published))
    status, meta = target.call("GET", f"/v2/models/{job.model}", timeout=10)
    if status != 200:
        raise PipelineError(f"Triton at {target.endpoint.address} did not describe model '{job.model}' (HTTP {status})",
                            "check that the model is loaded")
    return hash_settings(meta)


def summary(job: ModelTune) -> dict[str, Any]:
    """The tune.json entry of one model."""
    return {
        "baseline": job.baseline.to_dict(),
        "best": job.best.to_dict(),
        "trials": [t.to_dict() for t in job.trials],
        "space": job.space.to_dict(),
        "stopped": job.stopped,
        "seconds": round(job.seconds, 1),
    }
