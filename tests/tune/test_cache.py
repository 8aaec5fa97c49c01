"""The trial cache: durable appends, torn lines ignored, keys that change with what decides a result."""

from __future__ import annotations

from pathlib import Path

from pipeline.tune.cache import TrialCache, trial_key
from pipeline.tune.space import Candidate, config_for_candidate, config_json
from pipeline.tune.trial import Trial, TrialSettings
from tests.tune.helpers import point, trial
from tests.tune.test_space import published_config

POLICY = TrialSettings(slo_p99_ms=10).to_dict()
TARGET = {"kind": "embedded", "cores": 1}


def key(**changes: object) -> str:
    args = {"model_hash": "abc", "config": config_json(published_config()), "policy": POLICY, "target": TARGET, **changes}
    return trial_key(args["model_hash"], args["config"], args["policy"], args["target"])  # type: ignore[arg-type]


def test_key_changes_with_model_config_policy_slo_and_target() -> None:
    other_config = config_json(config_for_candidate(published_config(), Candidate(2, 64, (32, 64), 100)))
    keys = {
        key(),
        key(model_hash="abd"),
        key(config=other_config),
        key(policy=TrialSettings(slo_p99_ms=5).to_dict()),
        key(policy=TrialSettings(slo_p99_ms=10, open_loop=True, start=100).to_dict()),
        key(target={"kind": "embedded", "cores": 2}),
    }
    assert len(keys) == 6
    assert key() == key()


def test_trials_survive_a_torn_last_line_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "trials.jsonl"
    cache = TrialCache(path)
    measured = trial(Candidate(2, 32, (), 0), [point(1, 500, 2.0), point(2, 900, 4.0), point(4, 1000, 12.0)], baseline=True)
    cache.put("k1", measured.to_dict())
    with open(path, "a") as fh:
        fh.write('{"key": "k2", "trial": {"conf')  # a kill in the middle of a write
    again = TrialCache(path)
    assert set(again.entries) == {"k1"}
    restored = Trial.from_dict(again.get("k1"), TrialSettings(slo_p99_ms=10, fixed_load=4))  # type: ignore[arg-type]
    assert restored.cached and restored.candidate == measured.candidate
    assert restored.score == measured.score == 900
    again.put("k3", measured.to_dict())  # a fresh line after the torn one
    assert set(TrialCache(path).entries) == {"k1", "k3"}


def test_fresh_ignores_what_is_there(tmp_path: Path) -> None:
    path = tmp_path / "trials.jsonl"
    TrialCache(path).put("k1", trial(Candidate(1, 8, (), 0), [point(1, 10, 1)]).to_dict())
    assert TrialCache(path, fresh=True).get("k1") is None
    assert TrialCache(path).get("k1") is not None
