"""`tune` end to end on real tritonservers with small budgets: apply / no apply, resume after
SIGKILL, remote mode behind an admin key, the CPU MIG rehearsal, and bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.core.fingerprint import hash_path
from pipeline.triton.config import parse_config
from pipeline.tune.space import Candidate, candidate_from_config
from tests.conftest import ROOT, Built, cli, one_line_error

pytestmark = pytest.mark.slow

# Short windows and a short ramp: these tests check behaviour, not numbers.
FAST = ["--window-ms", "200", "--warmup-ms", "100", "--max-seconds", "3", "--max-load", "4",
        "--calibration-root", str(ROOT / "calibration")]
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def repo_copy(built: Built, tmp_path: Path) -> Path:
    repo = tmp_path / "model_repository"
    shutil.copytree(built.repository, repo, symlinks=True)
    return repo


def tune(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli("tune", *FAST, "--cache", str(tmp_path / "trials.jsonl"), *args, cwd=tmp_path, env=env)


def report(path: Path) -> dict:
    return json.loads((path / "tune.json").read_text())


def test_apply_publishes_exactly_one_version_with_the_best_config_and_no_apply_changes_nothing(built: Built, tmp_path: Path) -> None:
    repo = repo_copy(built, tmp_path)
    # A published config that cannot meet the SLO at low load: every request waits 200 ms for a batch.
    config_file = repo / "digits_fp32" / "config.pbtxt"
    slow = parse_config(config_file.read_text())
    slow.dynamic_batching.max_queue_delay_microseconds = 200_000
    from pipeline.triton.config import config_text

    config_file.write_text(config_text(slow))
    space = ["--instances", "1", "--max-batch", "64", "--preferred", "half+max", "--queue-delay-us", "0"]
    common = ["--repository", str(repo), "--model", "digits_fp32", "--slo-p99-ms", "100", "--max-trials", "3", "--cores", "1", *space]
    before = hash_path(repo)

    dry = tune(tmp_path, *common, "--report-dir", str(tmp_path / "dry"))
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert hash_path(repo) == before
    assert "+++ digits_fp32/config.pbtxt (tuned)" in dry.stdout and "repository unchanged" in dry.stdout
    doc = report(tmp_path / "dry")
    assert doc["baseline"]["config"]["max_queue_delay_us"] == 200_000 and not doc["baseline"]["meets_slo"]
    assert doc["best"]["meets_slo"] and doc["best"]["config"]["max_queue_delay_us"] == 0
    assert doc["best"]["infer_per_s"] >= doc["baseline"]["infer_per_s"]

    profiled = tune(tmp_path, *common, "--apply", "--profile", "cpu-1", "--report-dir", str(tmp_path / "profiled"))
    assert profiled.returncode == 0, profiled.stdout[-3000:] + profiled.stderr[-3000:]
    profile_config = repo / "digits_fp32" / "configs" / "cpu-1.pbtxt"
    assert candidate_from_config(parse_config(profile_config.read_text())) == Candidate.from_dict(doc["best"]["config"])
    assert "configs/cpu-1.pbtxt" in json.loads((repo / "digits_fp32" / ".pipeline-owned.json").read_text())["files"]
    assert sorted(p.name for p in (repo / "digits_fp32").iterdir() if p.name.isdigit()) == ["1"]
    assert parse_config(config_file.read_text()) == slow  # --profile leaves config.pbtxt alone

    applied = tune(tmp_path, *common, "--apply", "--report-dir", str(tmp_path / "applied"))
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    again = report(tmp_path / "applied")
    assert again["measured_trials"] == 0 and again["cached_trials"] == len(doc["trials"])  # all from the cache
    versions = sorted(int(p.name) for p in (repo / "digits_fp32").iterdir() if p.name.isdigit())
    assert versions == [1, 2]
    published = parse_config(config_file.read_text())
    assert candidate_from_config(published) == Candidate.from_dict(again["best"]["config"])
    assert (repo / "digits_fp32" / "2" / "model.onnx").read_bytes() == (repo / "digits_fp32" / "1" / "model.onnx").read_bytes()
    assert (repo / "digits_fp32" / "labels.txt").is_file() and (repo / "digits_fp32" / "warmup" / "image.bin").is_file()
    owned = json.loads((repo / "digits_fp32" / ".pipeline-owned.json").read_text())
    assert owned["versions"] == [1, 2] and "labels.txt" in owned["files"]
    for other in ("digits_fp16", "digits_int8"):
        assert hash_path(repo / other) == hash_path(built.repository / other)


def wait_for_file(marker: Path, proc: subprocess.Popen) -> None:
    """Until ``proc`` holds at its pause point (it writes ``marker``); fail if it exits first (the bound only guards a hang)."""
    deadline = time.monotonic() + 600
    while not marker.is_file():
        assert proc.poll() is None and time.monotonic() < deadline, f"never paused (exit {proc.returncode})"
        time.sleep(0.05)
    assert int(marker.read_text()) == proc.pid


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def test_a_tune_killed_with_sigkill_resumes_from_its_cache(built: Built, tmp_path: Path) -> None:
    cache = tmp_path / "trials.jsonl"
    args = ["tune", *FAST, "--cache", str(cache), "--repository", str(built.repository), "--model", "digits_fp32",
            "--slo-p99-ms", "1000", "--search", "grid", "--instances", "1,2", "--max-batch", "64", "--preferred", "half+max",
            "--queue-delay-us", "0,100", "--max-trials", "4", "--cores", "1"]
    paused = tmp_path / "paused"  # held right after its second trial is durable (pipeline/core/pausepoints.py): no race with trial 3
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", PIPELINE_PAUSE_AT="tune.trial-cached#2", PIPELINE_PAUSE_FILE=str(paused))
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args, "--report-dir", str(tmp_path / "killed")],
                                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for_file(paused, proc)
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-3000:]
    done = _lines(cache)
    assert done == 2
    assert not (tmp_path / "killed" / "tune.json").exists()

    resumed = cli(*args, "--report-dir", str(tmp_path / "resumed"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    doc = report(tmp_path / "resumed")
    assert (doc["cached_trials"], doc["measured_trials"]) == (done, 4 - done)
    assert [t["cached"] for t in doc["trials"]] == [True] * done + [False] * (4 - done)
    assert resumed.stdout.count("(cached)") == done


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_remote_tune_needs_the_admin_key_of_a_restricted_explicit_server(built: Built, tmp_path: Path) -> None:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_ADMIN_KEY="tune-test-key")
    with open(tmp_path / "serve.log", "w") as log:
        serve = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "serve", "--repository", str(built.repository), "--model-control", "explicit",
             "--restricted-api", "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0",
             "--log-file", str(tmp_path / "tritonserver.log")],
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(port, serve)
        url = ["--url", f"127.0.0.1:{port}", "--model", "digits_fp32", "--slo-p99-ms", "1000", "--max-trials", "2",
               "--instances", "1,2", "--max-batch", "64", "--preferred", "half+max", "--queue-delay-us", "100"]
        denied = tune(tmp_path, *url, "--report-dir", str(tmp_path / "denied"), env={"TRITON_ADMIN_KEY": ""})
        line = one_line_error(denied)
        assert "restricted" in line and "TRITON_ADMIN_KEY" in line
        assert not (tmp_path / "denied").exists()

        allowed = tune(tmp_path, *url, "--report-dir", str(tmp_path / "remote"), env={"TRITON_ADMIN_KEY": "tune-test-key"})
        assert allowed.returncode == 0, allowed.stdout[-3000:] + allowed.stderr[-3000:]
        doc = report(tmp_path / "remote")
        assert doc["target"]["kind"] == "remote" and doc["target"]["url"] == f"127.0.0.1:{port}"
        assert len(doc["trials"]) == 2 and {t["config"]["instance_count"] for t in doc["trials"]} == {1, 2}
        assert doc["best"]["meets_slo"]
        # The server is left serving its published config.
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/digits_fp32/config", headers={"admin-key": "tune-test-key"})
        with _DIRECT.open(request, timeout=10) as response:
            served = json.loads(response.read())
        assert served["instance_group"][0]["count"] == 1 and served["max_batch_size"] == 64
    finally:
        serve.terminate()
        serve.wait(timeout=60)


def _wait_ready(port: int, proc: subprocess.Popen) -> None:
    while proc.poll() is None:
        try:
            with _DIRECT.open(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"serve exited with {proc.returncode}")


def test_a_server_not_in_explicit_mode_is_one_line(built: Built, tmp_path: Path) -> None:
    from pipeline.triton.server import TritonServer

    with TritonServer(built.repository, log_path=tmp_path / "none.log") as server:
        proc = tune(tmp_path, "--url", server.http_url, "--model", "digits_fp32", "--slo-p99-ms", "10")
    assert "not in explicit model-control mode" in one_line_error(proc)


def test_mig_plan_from_two_rehearsal_profiles_ranks_layouts_by_measurement(built: Built, tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the cpu-2 rehearsal profile needs 2 CPUs")
    common = ["--repository", str(built.repository), "--model", "digits_fp32", "--slo-p99-ms", "1000", "--max-trials", "1"]
    for cores in (1, 2):
        proc = tune(tmp_path, *common, "--cores", str(cores), "--profile", f"cpu-{cores}", "--report-dir", str(tmp_path / f"cpu-{cores}"))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    measured = {cores: report(tmp_path / f"cpu-{cores}")["best"]["infer_per_s"] for cores in (1, 2)}
    plan = cli("mig-plan", "--from-tune", str(tmp_path / "cpu-1"), "--from-tune", str(tmp_path / "cpu-2"), cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    totals = {"2xcpu-1": 2 * measured[1], "1xcpu-2": measured[2], "1xcpu-1": measured[1]}
    ranked = sorted(totals, key=lambda k: -totals[k])
    positions = [plan.stdout.index(f" {label} ") for label in ranked]
    assert positions == sorted(positions), plan.stdout
    assert f"best measured layout {ranked[0]} — {totals[ranked[0]]:,.0f} infer/s" in plan.stdout
    assert "measured" in plan.stdout


def test_an_slo_no_candidate_meets_exits_1_names_the_closest_and_measures_no_gpu_memory_on_cpu(built: Built, tmp_path: Path) -> None:
    proc = tune(tmp_path, "--repository", str(built.repository), "--model", "digits_fp32", "--slo-p99-ms", "0.001",
                "--max-trials", "1", "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no candidate meets p99 ≤ 0.001 ms; closest: 1 inst, max 64" in proc.stdout
    doc = report(tmp_path / "r")
    assert not doc["best"]["meets_slo"]
    # A CPU server exports no GPU gauges: no memory is recorded, and nothing is said about it.
    assert doc["best"]["gpu_memory"] is None and all(t["gpu_memory"] is None for t in doc["trials"])
    assert "GPU" not in proc.stdout and "memory" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_tune_scenario_server_scores_each_config_by_its_highest_valid_qps_and_a_rerun_is_cached(built: Built, tmp_path: Path) -> None:
    """Each point a real LoadGen Server run against the embedded server: 200 and 400 QPS within a 200 ms bound are
    VALID here (600 and 1,200 queries: enough for early stopping; p99 is a few ms even at 3,200 QPS on this machine,
    so a stall of a busy one does not break the bound), so each configuration scores 400; a rerun measures nothing.
    A bound no run keeps is INVALID twice at the first target, with LoadGen's reason, and exits 1."""
    scenario = ["--repository", str(built.repository), "--model", "digits_fp32", "--scenario", "server", "--request-rate", "200",
                "--max-load", "400", "--min-duration-s", "3"]
    space = ["--search", "grid", "--instances", "1,2", "--max-batch", "64", "--preferred", "half+max", "--queue-delay-us", "0"]
    first = tune(tmp_path, *scenario, *space, "--slo-p99-ms", "200", "--max-trials", "2", "--report-dir", str(tmp_path / "first"))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    doc = report(tmp_path / "first")
    assert doc["load_policy"]["policy"] == "target_qps" and doc["load_policy"]["loadgen"] == "6.0.17"
    assert len(doc["trials"]) == 2 and doc["trials"][0]["baseline"]  # the published config first, then the grid
    for trial in doc["trials"]:
        assert [(p["load"], p["result"]) for p in trial["points"]] == [(200, "VALID"), (400, "VALID")], trial["points"]
        assert trial["meets_slo"] and trial["load"] == {"target_qps": 400} and trial["infer_per_s"] > 300
    assert "highest VALID MLPerf Server target QPS" in first.stdout and "VALID MLPerf Server target QPS (" in first.stdout

    again = tune(tmp_path, *scenario, *space, "--slo-p99-ms", "200", "--max-trials", "2", "--report-dir", str(tmp_path / "again"))
    assert again.returncode == 0 and report(tmp_path / "again")["measured_trials"] == 0 and report(tmp_path / "again")["cached_trials"] == 2

    tight = tune(tmp_path, *scenario, *space, "--slo-p99-ms", "0.001", "--max-trials", "1", "--report-dir", str(tmp_path / "tight"))
    assert tight.returncode == 1, tight.stdout[-3000:] + tight.stderr[-3000:]
    (trial,) = report(tmp_path / "tight")["trials"]
    (point,) = trial["points"]  # the break, run twice, kept once
    assert point["load"] == 200 and point["result"] == "INVALID" and point["retried"]
    assert "the latency bound was not met (its percentile over the bound)" in point["reasons"]


def test_bad_input_is_one_line_and_changes_nothing(built: Built, tmp_path: Path) -> None:
    repo = repo_copy(built, tmp_path)
    plan = repo / "digits_fp32_trt"
    (plan / "1").mkdir(parents=True)
    (plan / "1" / "model.plan").write_bytes(b"not really an engine")
    (plan / "config.pbtxt").write_text('name: "digits_fp32_trt"\nplatform: "tensorrt_plan"\nmax_batch_size: 16\n'
                                       'instance_group { count: 1 kind: KIND_GPU }\ndynamic_batching { }\n')
    (plan / ".pipeline-report.json").write_text(json.dumps({"versions": {"1": {"engine_metadata": {
        "profiles": [{"image": {"min": [1, 8, 8, 1], "opt": [16, 8, 8, 1], "max": [16, 8, 8, 1]}}]}}}}))
    before = hash_path(repo)
    base = ["--repository", str(repo), "--slo-p99-ms", "10"]
    cases = {
        "is not in the repository": tune(tmp_path, *base, "--model", "nope"),
        "above what digits_fp32_trt admits (batch ≤ 16": tune(tmp_path, *base, "--model", "digits_fp32_trt", "--max-batch", "8,64"),
        "is a TensorRT plan, which the embedded CPU server cannot load": tune(tmp_path, *base, "--model", "digits_fp32_trt"),
        "--instances ',' is not a comma-separated list": tune(tmp_path, *base, "--model", "digits_fp32", "--instances", ","),
        "cannot reach Triton at 127.0.0.1:": tune(tmp_path, *base, "--model", "digits_fp32", "--url", f"127.0.0.1:{_free_port()}"),
        "--slo-p99-ms -1 is not a latency": tune(tmp_path, "--repository", str(repo), "--slo-p99-ms", "-1", "--model", "digits_fp32"),
    }
    for expected, proc in cases.items():
        assert expected in one_line_error(proc)
    assert hash_path(repo) == before
    assert not (tmp_path / "trials.jsonl").exists() and not (tmp_path / "reports").exists()
