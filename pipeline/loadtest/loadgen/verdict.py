"""What a LoadGen run decided, read back from its detail log (``mlperf_log_detail.txt``): each ``:::MLLOG {json}``
line is one key and value. VALID or INVALID, the scenario's metric (MLPerf's definition), and the reasons."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError

DETAIL, SUMMARY, ACCURACY, TRACE = "mlperf_log_detail.txt", "mlperf_log_summary.txt", "mlperf_log_accuracy.json", "mlperf_log_trace.json"
LOGS = (SUMMARY, DETAIL, ACCURACY, TRACE)
_PREFIX = ":::MLLOG "

# Each scenario's metric: (its name, the detail log's key, the unit). SingleStream's is the early-stopping estimate
# of the 90th percentile, MultiStream's the 99th of the per-query latency (MLPerf Inference's rules since v2.1).
METRICS = {
    "SingleStream": ("p90 latency (early stopping estimate)", "early_stopping_latency_ss", "ns"),
    "MultiStream": ("p99 per-query latency (early stopping estimate)", "early_stopping_latency_ms", "ns"),
    "Server": ("completed samples per second", "result_completed_samples_per_sec", "samples/s"),
    "Offline": ("samples per second", "result_samples_per_second", "samples/s"),
}
_CHECKS = (("result_perf_constraints_met", "the latency bound was not met (its percentile over the bound)"),
           ("result_min_duration_met", "the run ended before its minimum duration"),
           ("result_min_queries_met", "fewer queries than the minimum query count"),
           ("early_stopping_met", "early stopping could not confirm the percentile with this many queries"))


@dataclass(frozen=True)
class ScenarioVerdict:
    """One run's outcome: ``valid`` as LoadGen printed it, the metric, the reasons when INVALID, the latency
    percentiles (ns) and LoadGen's own lines (its recommendation, its early-stopping result)."""

    scenario: str
    mode: str
    valid: bool
    metric: str
    value: float | None
    unit: str
    reasons: tuple[str, ...] = ()
    percentiles_ns: dict[str, float] = field(default_factory=dict)
    query_count: int | None = None
    errors: tuple[str, ...] = ()
    early_stopping: str = ""
    # INVALID only because early stopping could not yet confirm the percentile: the further queries LoadGen asks for
    more_queries: int | None = None

    @property
    def result(self) -> str:
        """VALID or INVALID; LOGGED for an accuracy run, which LoadGen does not judge (its log is judged instead)."""
        if self.mode == "AccuracyOnly":
            return "LOGGED"
        return "VALID" if self.valid else "INVALID"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"result": self.result}


def read_detail(path: Path) -> dict[str, Any]:
    """The detail log's keys and values (a key logged twice keeps its last value; errors are collected in ``"error"``)."""
    values: dict[str, Any] = {"error": []}
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError as exc:
        raise PipelineError(f"cannot read LoadGen's detail log {path} ({exc.strerror})", "run the scenario again") from None
    for line in lines:
        if not line.startswith(_PREFIX):
            continue
        try:
            entry = json.loads(line[len(_PREFIX):])
        except json.JSONDecodeError:
            continue  # a line cut short by a killed run
        if entry.get("metadata", {}).get("is_error"):
            values["error"].append(str(entry.get("value")))
        values[entry["key"]] = entry.get("value")
    return values


def verdict_from_log(folder: Path) -> ScenarioVerdict:
    """The verdict of the run whose logs are in ``folder``."""
    values = read_detail(Path(folder) / DETAIL)
    scenario = str(values.get("effective_scenario", "")).replace(" ", "")
    if scenario not in METRICS:
        raise PipelineError(f"LoadGen's detail log in {folder} names no known scenario ({scenario or 'none'})", "run the scenario again")
    mode = str(values.get("effective_test_mode", ""))
    name, key, unit = METRICS[scenario]
    valid = values.get("result_validity") == "VALID"
    early = " ".join(str(values.get("early_stopping_result", "")).split())
    reasons = [why + (f" ({early.lstrip('* ').replace(' * ', '; ')})" if check == "early_stopping_met" and early else "")
               for check, why in _CHECKS if values.get(check) is False]
    advice = str(values.get("result_invalid_reason") or "").strip()
    if advice:
        reasons.append(f"LoadGen: {advice}")
    percentile_key = "_percentile_per_query_latency_ns" if scenario == "MultiStream" else "_percentile_latency_ns"
    percentiles = {k[len("result_"):-len(percentile_key)]: float(v) for k, v in values.items()
                   if k.startswith("result_") and k.endswith(percentile_key)}
    value = values.get(key)
    only_early = values.get("early_stopping_met") is False and not any(values.get(c) is False for c, _ in _CHECKS[:3])
    asked = re.search(r"at least (\d+) more queries", early) if only_early and not valid else None
    return ScenarioVerdict(scenario=scenario, mode=mode, valid=valid, metric=name, value=float(value) if value else None, unit=unit,
                           reasons=tuple(reasons) if not valid else (), percentiles_ns=percentiles,
                           query_count=values.get("result_query_count"), errors=tuple(values["error"]),
                           early_stopping=early, more_queries=int(asked.group(1)) if asked else None)
