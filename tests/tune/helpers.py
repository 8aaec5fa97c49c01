"""Trials made from given load points, for the fast tests of results, caching and MIG plans."""

from __future__ import annotations

from pathlib import Path

from pipeline.tune.space import Candidate, search_space
from pipeline.tune.trial import Trial
from pipeline.tune.tuner import ModelTune
from tests.tune.test_space import published_config


def point(load: float, infer_per_s: float, p99_ms: float, slo: float = 10.0) -> dict:
    return {"load": load, "infer_per_s": infer_per_s, "p50_ms": p99_ms / 2, "p99_ms": p99_ms, "errors": 0, "stable": True,
            "overloaded": False, "avg_batch": 1.0, "queue_us": 10.0, "aborted": None, "meets_slo": p99_ms <= slo}


def trial(candidate: Candidate, points: list[dict], baseline: bool = False, slo: float = 10.0) -> Trial:
    return Trial(candidate, points, slo_p99_ms=slo, fixed_load=4, baseline=baseline)


def model_tune(model: str, trials: list[Trial], model_dir: Path | None = None) -> ModelTune:
    cfg = published_config()
    cfg.name = model
    base = Candidate(1, 64, (32, 64), 100)
    return ModelTune(model, cfg, base, search_space(base, None), model_dir, trials, stopped="test")
