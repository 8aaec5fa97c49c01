"""The settings of one LoadGen run: the scenario, the mode and the few numbers that decide it, from flags or from
LoadGen's own ``mlperf.conf`` / ``user.conf``, turned into LoadGen's ``TestSettings``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError, require
from pipeline.core.lazy import import_optional

# The command line's names → LoadGen's TestScenario members (and the names mlperf.conf uses).
SCENARIOS = {"single-stream": "SingleStream", "multi-stream": "MultiStream", "server": "Server", "offline": "Offline"}
MODES = {"performance": "PerformanceOnly", "accuracy": "AccuracyOnly"}


def loadgen() -> Any:
    """The ``mlperf_loadgen`` module (MLPerf's LoadGen, PyPI ``mlcommons-loadgen``)."""
    return import_optional("mlperf_loadgen", None, "An MLPerf scenario (loadtest --scenario)")


@dataclass(frozen=True)
class ScenarioSettings:
    """One LoadGen run. Latencies in milliseconds, durations in seconds; None leaves LoadGen's value (its defaults,
    or the conf files'). ``expected_*`` tell LoadGen how many queries to generate up front: a SingleStream run whose
    expected latency is far above the real one runs out of queries before its minimum duration (INVALID)."""

    scenario: str = "server"
    mode: str = "performance"
    target_qps: float | None = None          # Server: the Poisson arrival rate; Offline: the expected throughput
    latency_bound_ms: float | None = None    # Server: p99 must stay within it (MLPerf's target latency)
    expected_latency_ms: float | None = None  # SingleStream / MultiStream: how long a query is expected to take
    samples_per_query: int | None = None     # MultiStream: 8 in MLPerf
    min_duration_s: float | None = None
    min_query_count: int | None = None
    max_duration_s: float | None = None
    mlperf_conf: Path | None = None
    user_conf: Path | None = None
    conf_model: str = "*"                    # the model name the conf files' lines are matched against

    def __post_init__(self) -> None:
        require(self.scenario in SCENARIOS, f"unknown scenario '{self.scenario}'", f"choose one of {', '.join(SCENARIOS)}")
        require(self.mode in MODES, f"unknown mode '{self.mode}'", f"choose one of {', '.join(MODES)}")
        for name in ("target_qps", "latency_bound_ms", "expected_latency_ms", "min_duration_s", "max_duration_s"):
            value = getattr(self, name)
            require(value is None or value > 0, f"--{name.replace('_', '-')} must be positive, got {value}", "pass a positive number")
        require(self.samples_per_query is None or self.samples_per_query >= 1,
                f"--samples-per-query must be at least 1, got {self.samples_per_query}", "pass a positive count")
        require(self.min_query_count is None or self.min_query_count >= 1,
                f"--min-query-count must be at least 1, got {self.min_query_count}", "pass a positive count")
        for conf in (self.mlperf_conf, self.user_conf):
            require(conf is None or Path(conf).is_file(), f"LoadGen configuration file {conf} does not exist", "pass the path of an mlperf.conf or user.conf")

    def test_settings(self) -> Any:
        """LoadGen's ``TestSettings``: the conf files first (mlperf.conf, then user.conf, as MLPerf's harnesses load
        them), then every value given here over them."""
        lg = loadgen()
        settings = lg.TestSettings()
        scenario = SCENARIOS[self.scenario]
        for conf, conf_type in ((self.mlperf_conf, 0), (self.user_conf, 1)):  # LoadGen's conf_type: 1 reads a user.conf
            if conf is not None and settings.FromConfig(str(conf), self.conf_model, scenario, conf_type) != 0:
                raise PipelineError(f"LoadGen could not read {conf} for scenario {scenario}",
                                    "check its lines: <model>.<Scenario>.<key> = <value>, as in MLPerf's mlperf.conf")
        settings.scenario = getattr(lg.TestScenario, scenario)
        settings.mode = getattr(lg.TestMode, MODES[self.mode])
        ns = 1_000_000
        if self.target_qps is not None:
            settings.server_target_qps = self.target_qps
            settings.offline_expected_qps = self.target_qps
        if self.latency_bound_ms is not None:
            settings.server_target_latency_ns = int(self.latency_bound_ms * ns)
        if self.expected_latency_ms is not None:
            settings.single_stream_expected_latency_ns = int(self.expected_latency_ms * ns)
            settings.multi_stream_expected_latency_ns = int(self.expected_latency_ms * ns)
        if self.samples_per_query is not None:
            settings.multi_stream_samples_per_query = self.samples_per_query
        if self.min_duration_s is not None:
            settings.min_duration_ms = int(self.min_duration_s * 1000)
        if self.max_duration_s is not None:
            settings.max_duration_ms = int(self.max_duration_s * 1000)
        if self.min_query_count is not None:
            settings.min_query_count = self.min_query_count
        return settings
