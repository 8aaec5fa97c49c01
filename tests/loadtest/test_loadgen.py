"""MLPerf's LoadGen (the real ``mlperf_loadgen``) through pipeline/loadtest/loadgen/: each scenario run against a
system under test that answers at once writes LoadGen's four logs, and the verdict read back from them is what
LoadGen decided; a latency bound below what the run measured is INVALID with its reason; flags and LoadGen's own
conf files set the run. No Triton here: the runs against a server are in the loadtest command's tests."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from pipeline.core.errors import PipelineError
from pipeline.loadtest.loadgen.accuracy import read_accuracy_log
from pipeline.loadtest.loadgen.run import AnswersAtOnce, run_scenario
from pipeline.loadtest.loadgen.settings import ScenarioSettings
from pipeline.loadtest.loadgen.verdict import ACCURACY, DETAIL, LOGS, SUMMARY, read_detail

# Settings an instant system under test meets on any machine: enough queries for early stopping, and more generated
# up front than the fastest machine answers within the minimum duration. LoadGen generates duration / expected latency
# queries (or duration × QPS samples offline); a query through LoadGen's Python callbacks costs at least a few µs
# (measured here: 4 µs single-stream, 25 µs multi-stream of 8, 6 µs per offline sample), so expecting 0.5-1 µs leaves
# a margin of 4× and more. Expecting what this machine does made a busy run VALID and an idle one run out (INVALID).
MET = {
    "single-stream": dict(expected_latency_ms=0.0005, min_duration_s=0.1, min_query_count=100),
    "multi-stream": dict(expected_latency_ms=0.001, min_duration_s=0.1, min_query_count=700, samples_per_query=8),
    "server": dict(target_qps=1000, latency_bound_ms=50, min_duration_s=1, min_query_count=100),
    "offline": dict(target_qps=5_000_000, min_duration_s=0.02, min_query_count=1),
}
SCENARIO_NAMES = {"single-stream": "SingleStream", "multi-stream": "MultiStream", "server": "Server", "offline": "Offline"}


@pytest.mark.parametrize("scenario", list(MET))
def test_each_scenario_writes_the_four_logs_and_is_valid_at_settings_it_meets(scenario: str, tmp_path: Path) -> None:
    verdict = run_scenario(ScenarioSettings(scenario=scenario, **MET[scenario]), AnswersAtOnce(), 512, tmp_path / "logs")
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == sorted(LOGS)
    summary = (tmp_path / "logs" / SUMMARY).read_text()
    assert "Result is : VALID" in summary and verdict.valid and verdict.result == "VALID", (verdict, summary)
    assert verdict.scenario == SCENARIO_NAMES[scenario] and verdict.mode == "PerformanceOnly" and verdict.reasons == ()
    assert verdict.value is not None and verdict.value > 0 and not verdict.errors
    if scenario == "multi-stream":
        assert read_detail(tmp_path / "logs" / DETAIL)["effective_samples_per_query"] == 8


def test_a_latency_bound_below_the_measured_p99_is_invalid_and_says_why(tmp_path: Path) -> None:
    """Even answering at once costs LoadGen microseconds: a 100 ns bound is below every query's latency."""
    settings = ScenarioSettings(scenario="server", target_qps=1000, latency_bound_ms=0.0001, min_duration_s=1, min_query_count=100)
    verdict = run_scenario(settings, AnswersAtOnce(), 512, tmp_path / "logs")
    assert "Result is : INVALID" in (tmp_path / "logs" / SUMMARY).read_text()
    assert not verdict.valid and verdict.percentiles_ns["99.00"] > 100
    assert "the latency bound was not met (its percentile over the bound)" in verdict.reasons, verdict.reasons
    assert verdict.to_dict()["result"] == "INVALID"
    assert verdict.more_queries is None  # more queries would not help a bound every query misses


def test_a_run_too_short_for_early_stopping_says_how_many_more_queries_and_that_many_make_it_valid(tmp_path: Path) -> None:
    """Every query within the (1 s) bound, but 60 are too few for early stopping to confirm p99: LoadGen names the queries
    still needed (deterministic with no query over the bound), and a run of that many more is VALID."""
    short = ScenarioSettings(scenario="server", target_qps=1000, latency_bound_ms=1000, min_duration_s=0.01, min_query_count=60)
    verdict = run_scenario(short, AnswersAtOnce(), 16, tmp_path / "short", trace=False)
    assert not verdict.valid and verdict.query_count == 60 and verdict.more_queries is not None and verdict.more_queries > 0
    assert [r.split(" (")[0] for r in verdict.reasons] == ["early stopping could not confirm the percentile with this many queries"]
    assert (tmp_path / "short" / "mlperf_log_trace.json").stat().st_size == 0  # trace=False: the trace log is left empty
    longer = ScenarioSettings(scenario="server", target_qps=1000, latency_bound_ms=1000, min_duration_s=0.01,
                              min_query_count=60 + verdict.more_queries)
    again = run_scenario(longer, AnswersAtOnce(), 16, tmp_path / "long")
    assert again.valid and again.more_queries is None, again.reasons


def test_a_user_conf_sets_the_run_and_a_flag_overrides_it(tmp_path: Path) -> None:
    conf = tmp_path / "user.conf"
    conf.write_text("*.Server.target_qps = 321\n*.Server.min_duration = 500\n")
    run_scenario(ScenarioSettings(scenario="server", user_conf=conf, min_query_count=10), AnswersAtOnce(), 64, tmp_path / "a")
    values = read_detail(tmp_path / "a" / DETAIL)
    assert (values["effective_target_qps"], values["effective_min_duration_ms"]) == (321, 500)
    run_scenario(ScenarioSettings(scenario="server", user_conf=conf, target_qps=400, min_query_count=10), AnswersAtOnce(), 64, tmp_path / "b")
    assert read_detail(tmp_path / "b" / DETAIL)["effective_target_qps"] == 400


@pytest.mark.parametrize(("options", "message"), [
    (dict(scenario="streaming"), "unknown scenario 'streaming' — choose one of single-stream, multi-stream, server, offline"),
    (dict(mode="submission"), "unknown mode 'submission' — choose one of performance, accuracy"),
    (dict(target_qps=0), "--target-qps must be positive, got 0 — pass a positive number"),
    (dict(samples_per_query=0), "--samples-per-query must be at least 1, got 0 — pass a positive count"),
    (dict(user_conf=Path("/nonexistent/user.conf")), "LoadGen configuration file /nonexistent/user.conf does not exist"),
])
def test_settings_are_checked_before_loadgen_starts(options: dict, message: str) -> None:
    with pytest.raises(PipelineError) as caught:
        ScenarioSettings(**options)
    assert str(caught.value).startswith(message)


def test_each_sample_loadgen_issues_is_its_own_request_and_a_failed_one_is_still_answered(tmp_path: Path) -> None:
    """LoadGen's accuracy mode issues every sample exactly once: the server (a scripted one on loopback, whose third
    request gets a 503 and whose fifth connection is closed mid-request) must receive each sample's own body once, and
    the run must end, every sample answered to LoadGen, the failures counted by the engine."""
    from pipeline.loadtest.client import Endpoint, post_request_bytes
    from pipeline.loadtest.loadgen.http_sut import TritonSut
    from tests.loadtest.scripted_server import ScriptedServer

    script = {2: "error", 4: "close"}
    with ScriptedServer(lambda seq: script.get(seq, "ok"), echo=True) as server:
        endpoint = Endpoint("127.0.0.1", server.port)
        bodies = [f'{{"sample": {i}}}'.encode() for i in range(12)]
        sut = TritonSut("scripted", endpoint, [post_request_bytes(endpoint, "/infer", b) for b in bodies], "single-stream", timeout_s=10,
                        keep_answers=True)
        verdicts: list = []
        run = threading.Thread(target=lambda: verdicts.append(
            run_scenario(ScenarioSettings(scenario="single-stream", mode="accuracy"), sut, len(bodies), tmp_path / "logs")), daemon=True)
        sut.start()
        try:
            run.start()
            run.join(300)  # a sample never answered keeps LoadGen waiting for ever: fail instead of hanging the suite
            assert not run.is_alive(), "LoadGen still waits for a sample the system under test never answered"
        finally:
            sut.stop()
        received = sorted(server.bodies)
    assert verdicts[0].mode == "AccuracyOnly"
    assert received == sorted(bodies)  # each sample's own request, once (a closed connection's request is not sent again)
    recorder = sut.engine.recorder
    assert recorder.sent == 12 and len(recorder.latency_ns) == 10 and sum(recorder.errors.values()) == 2, recorder.errors
    # the accuracy log holds each answered sample's own response (the server echoes its request), the failed ones nothing
    logged = {e["qsl_idx"]: bytes.fromhex(e["data"]) for e in json.loads((tmp_path / "logs" / ACCURACY).read_text())}
    answered = {i: r for i, r in logged.items() if r}
    assert len(logged) == 12 and len(answered) == 10
    for index, response in answered.items():
        assert response.startswith(b"HTTP/1.1 200 OK\r\n") and response.endswith(b"\r\n\r\n" + bodies[index]), (index, response)
    with pytest.raises(PipelineError) as caught:
        read_accuracy_log(tmp_path / "logs" / ACCURACY, 12)
    first = min(set(range(12)) - set(answered))
    assert str(caught.value).startswith(f"2 of 12 samples have no answer in {tmp_path / 'logs' / ACCURACY} (first: sample {first})")


def test_samples_a_down_server_never_takes_are_answered_as_failed_so_loadgen_ends(tmp_path: Path) -> None:
    """Every connect refused (nothing listens): the samples wait in the backlog, and after the time-out each is
    answered to LoadGen as failed, counted as not sent; without that, LoadGen would wait for ever."""
    import socket

    from pipeline.loadtest.client import Endpoint, post_request_bytes
    from pipeline.loadtest.loadgen.http_sut import TritonSut

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = Endpoint("127.0.0.1", port)
    sut = TritonSut("down", endpoint, [post_request_bytes(endpoint, "/infer", b"{}")] * 4, "offline", timeout_s=0.5)
    verdicts: list = []
    run = threading.Thread(target=lambda: verdicts.append(
        run_scenario(ScenarioSettings(scenario="offline", mode="accuracy"), sut, 4, tmp_path / "logs")), daemon=True)
    sut.start()
    try:
        run.start()
        run.join(300)
        assert not run.is_alive(), "LoadGen still waits for samples the system under test never sent"
    finally:
        sut.stop()
    errors = sut.engine.recorder.errors
    assert errors.get("not_sent") == 4 and errors.get("connect_refused", 0) >= 1, errors
    logged = json.loads((tmp_path / "logs" / ACCURACY).read_text())
    assert sorted(e["qsl_idx"] for e in logged) == [0, 1, 2, 3] and not any(e["data"] for e in logged)


def test_an_answer_logged_for_a_padded_copy_of_a_sample_counts(tmp_path: Path) -> None:
    """Multi-stream pads its last query with samples again: a sample whose first copy failed and whose copy
    succeeded has an answer; one that failed every time has none, and the error names it."""
    log = tmp_path / ACCURACY
    log.write_text(json.dumps([{"seq_id": 0, "qsl_idx": 0, "data": ""}, {"seq_id": 1, "qsl_idx": 1, "data": "4142"},
                               {"seq_id": 2, "qsl_idx": 0, "data": "4344"}, {"seq_id": 3, "qsl_idx": 2, "data": ""}]))
    with pytest.raises(PipelineError, match=r"^1 of 3 samples have no answer in .* \(first: sample 2\)"):
        read_accuracy_log(log, 3)
    assert read_accuracy_log(log, 2) == [b"CD", b"AB"]


def test_samples_queued_behind_others_wait_as_long_as_the_server_keeps_answering(tmp_path: Path) -> None:
    """Offline issues every sample at once: 60 samples over 2 connections to a server answering each in 0.1 s take
    3 s, past the 2 s time-out, yet every one is sent and answered, since answers keep coming."""
    from pipeline.loadtest.client import Endpoint, post_request_bytes
    from pipeline.loadtest.loadgen.http_sut import TritonSut
    from tests.loadtest.scripted_server import ScriptedServer

    with ScriptedServer(lambda seq: "ok", delay_s=0.1) as server:
        endpoint = Endpoint("127.0.0.1", server.port)
        sut = TritonSut("slow", endpoint, [post_request_bytes(endpoint, "/infer", b"{}")] * 60, "offline", timeout_s=2, max_connections=2)
        sut.start()
        try:
            run_scenario(ScenarioSettings(scenario="offline", mode="accuracy"), sut, 60, tmp_path / "logs")
        finally:
            sut.stop()
    recorder = sut.engine.recorder
    assert recorder.errors == {} and recorder.sent == len(recorder.latency_ns) == 60
    assert max(recorder.lag_ns) > 2e9  # some waited in the client longer than the time-out
