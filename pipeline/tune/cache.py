"""The trial cache: every measured trial, keyed by what determines its result.

Key: sha256 of (model file hash, the full candidate config, the load policy and measurement
settings, the SLO, the target's identity). One JSON line per trial, appended and fsynced as soon
as the trial ends, so a tune killed at any moment (SIGKILL included) keeps every finished trial
and a torn last line is ignored. A resumed or repeated tune re-measures nothing it already has;
``--fresh`` ignores the entries (new ones still go in, and later lines win).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from pipeline.core.fingerprint import hash_settings
from pipeline.core.pausepoints import pause_point

log = logging.getLogger(__name__)

FORMAT = 1


def trial_key(model_hash: str, config_json: str, load_policy: dict[str, Any], target: dict[str, Any]) -> str:
    """The cache key of one trial (the SLO is part of ``load_policy``)."""
    return hash_settings({"format": FORMAT, "model": model_hash, "config": json.loads(config_json),
                          "load_policy": load_policy, "target": target})


class TrialCache:
    """A JSON-lines file of ``{"key": ..., "trial": {...}}``."""

    def __init__(self, path: Path, fresh: bool = False) -> None:
        self.path = Path(path)
        self.entries: dict[str, dict[str, Any]] = {} if fresh else self._read()

    def _read(self) -> dict[str, dict[str, Any]]:
        entries: dict[str, dict[str, Any]] = {}
        if not self.path.is_file():
            return entries
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            try:
                record = json.loads(line)
                entries[str(record["key"])] = dict(record["trial"])
            except (ValueError, KeyError, TypeError):
                log.warning("%s line %d is incomplete (a killed run?); ignored", self.path, number)
        return entries

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached trial under ``key``, if any."""
        return self.entries.get(key)

    def put(self, key: str, trial: dict[str, Any]) -> None:
        """Append one trial durably."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"key": key, "trial": trial}, sort_keys=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            if fh.tell() > 0 and not self._ends_with_newline():
                fh.write("\n")  # after a torn line, start a fresh one
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        self.entries[key] = trial
        pause_point("tune.trial-cached")  # tests hold a tune here, its n-th trial durable, to kill it (pipeline/core/pausepoints.py)

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"
