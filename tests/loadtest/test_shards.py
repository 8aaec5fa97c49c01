"""A distributed load test rehearsed on this machine: three shard processes on one shared schedule (fixed by
the ready barrier) against the real embedded tritonserver, each writing its raw results; ``--merge`` gives one report
whose percentiles are exactly those of every shard's raw samples and whose counts are Triton's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import PipelineError
from pipeline.loadtest.client import endpoint_from_url
from pipeline.loadtest.merge import merge_shards
from pipeline.loadtest.server_stats import fetch_counters
from pipeline.loadtest.shards import ShardPlan, parse_ready_margin, read_shard, start_when_ready, write_shard

from .test_cli import run_cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHARDS = 3
OPTIONS = ["--model", "add", "--concurrency", "2,4", "--window-ms", "300", "--warmup-ms", "200", "--max-seconds", "1.5",
           "--timeout-ms", "2000"]  # fmt: skip


def _wait_for(paths: list[Path], procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 600  # a hang guard, not a speed limit
    while not all(p.exists() for p in paths):
        assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs if p.poll() is not None]
        assert time.monotonic() < deadline, f"never appeared: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def rehearsal(server: object, workspace: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Three shard processes (as the Job's pods run them) started through the ready barrier (``--start-at
    ready+SECONDS``); shard 2 is held at the barrier by a pause point until the other two have said they are
    ready, so the test sees them wait for it. Triton's success count around all of them."""
    out = tmp_path_factory.mktemp("shards")
    held = tmp_path_factory.mktemp("held") / "shard-2.paused"
    endpoint = endpoint_from_url(server.http_url)  # type: ignore[attr-defined]
    before = fetch_counters(endpoint, "add").success_count
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PIPELINE_PAUSE_AT", None)
    # No shard can be late however slow it is to start: the schedule is fixed only once all three are ready,
    # 10 s after the last (which covers the 50 ms poll of processes already running, not a start-up).
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pipeline", "loadtest", "--url", server.http_url, *OPTIONS,  # type: ignore[attr-defined]
             "--calibration-root", str(workspace / "calibration"), "--shard", f"{i}/{SHARDS}", "--start-at", "ready+10",
             "--shard-output", str(out), *(["--workers", "2"] if i == 1 else [])],  # a shard may itself use several processes
            env={**env, "PIPELINE_PAUSE_AT": "shard.ready", "PIPELINE_PAUSE_FILE": str(held)} if i == 2 else env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(SHARDS)
    ]
    try:
        _wait_for([out / ".ready" / "shard-0-of-3", out / ".ready" / "shard-1-of-3", held], procs)
        waiting = [p.poll() is None for p in procs[:2]], sorted(f.name for f in out.glob("shard-*.npz"))
        held.with_name(held.name + ".release").touch()
        outputs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert waiting == ([True, True], []), "shards 0 and 1 must wait at the barrier for shard 2"
    assert [p.returncode for p in procs] == [0] * SHARDS, outputs
    after = fetch_counters(endpoint, "add").success_count
    return {"dir": out, "triton_successes": after - before, "outputs": outputs}


def _raw_used_latencies(files: list[Path], k: int) -> np.ndarray:
    """What a test computes by itself: every shard's raw latencies of point k's last 3 windows."""
    parts = []
    for f in files:
        meta, arrays = read_shard(f)
        if not meta["points"][k]["share"]:
            continue  # c=2 over 3 shards: shard 2 has no share
        marks = meta["points"][k]["marks"]
        lo, hi = marks[-4]["latency_pos"][0], marks[-1]["latency_pos"][0]
        parts.append(arrays[f"p{k}_e0_lat"][lo:hi])
    return np.concatenate(parts)


def test_merge_reproduces_exact_percentiles_and_tritons_counts(rehearsal: dict[str, object]) -> None:
    files = sorted(Path(rehearsal["dir"]).glob("shard-*.npz"))  # type: ignore[arg-type]
    assert [f.name for f in files] == [f"shard-{i}-of-3.npz" for i in range(3)]
    result = merge_shards(files)
    assert not result.failures and [p.label for p in result.points] == ["c=2", "c=4"]
    for k, point in enumerate(result.points):
        raw = _raw_used_latencies(files, k) / 1e6
        agg = point.aggregate
        assert agg.requests == raw.size
        for p in (50, 90, 95, 99):
            assert agg.latency.percentile_ms(p) == np.percentile(raw, p, method="inverted_cdf")  # exact, not within a bin
        assert agg.latency.max_ms == raw.max()
        # Triton's count over the whole point (read by shard 0 around the slot) is every shard's successes
        assert agg.client_successes_total == agg.server_successes_total
        assert point.incomplete is None and point.aborted is None and agg.error_count == 0
    # around the whole run: the points, and each shard's check of its first request (ours, then tritonclient's)
    assert sum(p.aggregate.client_successes_total for p in result.points) + 2 * SHARDS == rehearsal["triton_successes"]


def test_merge_cli_writes_one_report(rehearsal: dict[str, object], tmp_path: Path) -> None:
    assert run_cli("--merge", str(rehearsal["dir"]), "--report-dir", str(tmp_path)) == 0
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["settings"]["shards"] == 3 and len(payload["points"]) == 2


def test_a_missing_shard_makes_the_points_incomplete_and_keeps_the_others(rehearsal: dict[str, object]) -> None:
    files = sorted(Path(rehearsal["dir"]).glob("shard-*.npz"))  # type: ignore[arg-type]
    result = merge_shards(files[:2])
    assert all(p.incomplete == "shard(s) 2 of 3 missing" for p in result.points)
    assert len(result.failures) == 2 and all(p.aggregate.requests > 0 for p in result.points)


def test_merging_different_load_tests_is_a_one_line_error(rehearsal: dict[str, object], tmp_path: Path) -> None:
    first = sorted(Path(rehearsal["dir"]).glob("shard-*.npz"))[0]  # type: ignore[arg-type]
    meta, arrays = read_shard(first)
    meta["settings"]["protocol"] = "grpc"
    meta["shard"]["index"] = 1
    other = write_shard(tmp_path / "shard-1-of-3.npz", meta, arrays)
    with pytest.raises(PipelineError, match=r"cannot merge .* different protocol \(http and grpc\)") as err:
        merge_shards([first, other])
    assert "\n" not in str(err.value.problem)


def test_every_shard_fixed_the_same_start_after_the_barrier(rehearsal: dict[str, object]) -> None:
    files = sorted(Path(rehearsal["dir"]).glob("shard-*.npz"))  # type: ignore[arg-type]
    starts = {read_shard(f)[0]["shard"]["start_at"] for f in files}
    ready = [float(f.read_text()) for f in sorted((Path(rehearsal["dir"]) / ".ready").glob("shard-*"))]  # type: ignore[arg-type]
    assert len(ready) == 3 and starts == {max(ready) + 10}


def test_a_folder_that_holds_another_runs_barrier_is_refused(rehearsal: dict[str, object]) -> None:
    plan = ShardPlan(0, 3, 0.0, ready_margin_s=10)
    with pytest.raises(PipelineError, match=r"holds another load test's shards") as err:
        start_when_ready(plan, Path(rehearsal["dir"]))  # type: ignore[arg-type]
    assert "its own --shard-output" in err.value.fix


@pytest.mark.parametrize("text", ["ready+", "ready+0", "ready+x", "ready+-5", "ready+7200"])
def test_a_bad_ready_margin_is_one_line(text: str) -> None:
    with pytest.raises(PipelineError, match="is not ready\\+SECONDS"):
        parse_ready_margin(text)


def test_a_time_is_not_a_ready_margin() -> None:
    assert parse_ready_margin("2026-12-01T21:00:00Z") is None and parse_ready_margin("+60") is None
    assert parse_ready_margin("ready+2.5") == 2.5
