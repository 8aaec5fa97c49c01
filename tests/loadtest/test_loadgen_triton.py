"""MLPerf's LoadGen driving the embedded tritonserver through the load test's HTTP engine
(pipeline/loadtest/loadgen/http_sut.py): each scenario at settings this machine meets is VALID, and Triton answered
every sample LoadGen issued (its own statistics say so); a latency bound below the run's p99 is INVALID, with the
reason. Real LoadGen, real Triton, the ``add`` model of tests/loadtest/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.loadtest.client import endpoint_from_url
from pipeline.loadtest.loadgen.http_sut import TritonSut
from pipeline.loadtest.loadgen.run import run_scenario
from pipeline.loadtest.loadgen.settings import ScenarioSettings
from pipeline.loadtest.loadgen.verdict import SUMMARY
from pipeline.loadtest.policy import ClosedLoop
from pipeline.loadtest.runner import LoadTestSettings, model_spec
from pipeline.loadtest.server_stats import fetch_counters

pytestmark = pytest.mark.slow

# Settings a loaded 2-core machine meets with the add model (a request takes about half a millisecond here). LoadGen
# generates its queries up front from the expected latency (or QPS): expecting faster than real only generates more
# than the run uses; expecting slower runs out before the minimum duration (INVALID).
MET = {
    "single-stream": dict(expected_latency_ms=0.05, min_duration_s=1, min_query_count=100),
    "multi-stream": dict(expected_latency_ms=0.1, min_duration_s=1, min_query_count=700, samples_per_query=8),
    "server": dict(target_qps=150, latency_bound_ms=500, min_duration_s=4, min_query_count=100),
    "offline": dict(target_qps=50_000, min_duration_s=0.3, min_query_count=1),  # 16,500 samples: seconds even on a fast server
}


def _payloads(server: object, workspace: Path) -> tuple[object, list[bytes]]:
    endpoint = endpoint_from_url(server.http_url)  # type: ignore[attr-defined]
    settings = LoadTestSettings(endpoints=(endpoint,), policies=(ClosedLoop(1),), models=("add",), calibration_dir=workspace / "calibration",
                                distinct_requests=64)
    (target,) = model_spec(settings, "add").targets
    return endpoint, target[1]


def _run(server: object, workspace: Path, settings: ScenarioSettings, out: Path) -> tuple[object, int, TritonSut]:
    endpoint, payloads = _payloads(server, workspace)
    before = fetch_counters(endpoint, "add").success_count  # type: ignore[arg-type]
    sut = TritonSut("add", endpoint, payloads, settings.scenario)  # type: ignore[arg-type]
    sut.start()
    try:
        verdict = run_scenario(settings, sut, len(payloads), out)
    finally:
        sut.stop()
    return verdict, fetch_counters(endpoint, "add").success_count - before, sut  # type: ignore[arg-type]


@pytest.mark.parametrize("scenario", list(MET))
def test_each_scenario_against_triton_is_valid_and_every_sample_was_answered_by_it(scenario: str, server: object, workspace: Path,
                                                                                    tmp_path: Path) -> None:
    verdict, served, sut = _run(server, workspace, ScenarioSettings(scenario=scenario, **MET[scenario]), tmp_path / "logs")
    summary = (tmp_path / "logs" / SUMMARY).read_text()
    assert verdict.valid and "Result is : VALID" in summary, (verdict.reasons, summary)  # type: ignore[attr-defined]
    recorder = sut.engine.recorder
    assert not recorder.errors and recorder.sent == len(recorder.latency_ns) == served  # Triton answered each sample, once
    samples = verdict.query_count * (8 if scenario == "multi-stream" else 1)  # type: ignore[attr-defined]
    assert served == (recorder.sent if scenario == "offline" else samples)  # Offline: one query of many samples


def test_a_latency_bound_below_the_measured_p99_is_invalid_with_its_reason(server: object, workspace: Path, tmp_path: Path) -> None:
    settings = ScenarioSettings(scenario="server", target_qps=100, latency_bound_ms=0.01, min_duration_s=1, min_query_count=50)
    verdict, _, _ = _run(server, workspace, settings, tmp_path / "logs")
    assert not verdict.valid and "Result is : INVALID" in (tmp_path / "logs" / SUMMARY).read_text()  # type: ignore[attr-defined]
    assert verdict.percentiles_ns["99.00"] > 10_000  # type: ignore[attr-defined]
    assert "the latency bound was not met (its percentile over the bound)" in verdict.reasons  # type: ignore[attr-defined]


def test_loadtest_scenario_writes_logs_and_verdicts_and_its_exit_status_is_the_verdict(server: object, workspace: Path, tmp_path: Path) -> None:
    import csv
    import json

    from tests.loadtest.test_cli import run_cli

    common = ["--url", server.http_url, "--model", "add", "--calibration-root", str(workspace / "calibration"),  # type: ignore[attr-defined]
              "--scenario", "server", "--target-qps", "150", "--min-duration-s", "4", "--min-query-count", "100"]
    assert run_cli(*common, "--latency-bound-ms", "500", "--report-dir", str(tmp_path / "ok")) == 0
    assert "Result is : VALID" in (tmp_path / "ok" / "mlperf" / "add" / SUMMARY).read_text()
    (run,) = json.loads((tmp_path / "ok" / "mlperf.json").read_text())["runs"]
    assert (run["model"], run["scenario"], run["result"], run["reasons"]) == ("add", "Server", "VALID", [])
    with open(tmp_path / "ok" / "mlperf.csv", newline="") as fh:
        assert [r["result"] for r in csv.DictReader(fh)] == ["VALID"]

    assert run_cli(*common, "--latency-bound-ms", "0.01", "--report-dir", str(tmp_path / "bound")) == 1  # a check that said no
    (run,) = json.loads((tmp_path / "bound" / "mlperf.json").read_text())["runs"]
    assert run["result"] == "INVALID" and "the latency bound was not met (its percentile over the bound)" in run["reasons"]


def test_scenario_options_are_checked_before_a_server_starts(tmp_path: Path) -> None:
    from pipeline.core.errors import PipelineError
    from tests.loadtest.test_cli import run_cli

    nothing = ["--repository", str(tmp_path / "nothing"), "--report-dir", str(tmp_path / "r")]
    with pytest.raises(PipelineError, match=r"^--scenario server needs --target-qps \(the Poisson arrival rate\) — pass --target-qps"):
        run_cli(*nothing, "--scenario", "server")
    with pytest.raises(PipelineError, match=r"^--scenario server needs --latency-bound-ms"):
        run_cli(*nothing, "--scenario", "server", "--target-qps", "10")
    with pytest.raises(PipelineError, match=r"^LoadGen configuration file .*user.conf does not exist"):
        run_cli(*nothing, "--scenario", "offline", "--user-conf", str(tmp_path / "user.conf"))
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("scenario", list(MET))
def test_the_bundled_model_on_the_embedded_server_is_valid_in_each_scenario(scenario: str, built: object, tmp_path: Path) -> None:
    """As a user runs it: no --url (the embedded server starts on the built repository), the bundled model's FP32
    variant and its evaluation data, settings this machine meets."""
    import json

    from tests.loadtest.test_cli import run_cli

    flags = [f"--{key.replace('_', '-')}={value}" for key, value in MET[scenario].items()]
    code = run_cli("--repository", str(built.repository), "--workdir", str(tmp_path / "w"), "--model", "digits_fp32",  # type: ignore[attr-defined]
                   "--scenario", scenario, *flags, "--report-dir", str(tmp_path / "r"))
    (run,) = json.loads((tmp_path / "r" / "mlperf.json").read_text())["runs"]
    assert code == 0 and run["result"] == "VALID", run
    assert "Result is : VALID" in (tmp_path / "r" / "mlperf" / "digits_fp32" / SUMMARY).read_text()
    assert run["client_errors"] == {} and run["value"] > 0
