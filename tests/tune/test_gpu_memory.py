"""GPU memory per trial: the gauge reading, the wait until it stops falling, the arithmetic, and the
records in tune.json, trials.csv, the table and the cache.

No GPU exists here, so a small local HTTP server stands in for Triton's GPU metrics: it serves
Prometheus text with ``nv_gpu_memory_used_bytes`` values the test controls, refreshed like
Triton's gauges (the value of the last refresh tick). Time is a fake clock the meter sleeps on, so
the waits are checked without wall-clock assertions.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.loadtest.client import Endpoint
from pipeline.tune.gpu_memory import SETTLE_REFRESHES, SOURCE, GpuMemory, MemoryMeter, record
from pipeline.tune.results import progress_line, table, tune_document, write_reports
from pipeline.tune.space import Candidate
from pipeline.tune.trial import Trial, TrialSettings
from tests.conftest import ROOT, Built
from tests.tune.helpers import model_tune, point, trial

MIB = 1 << 20
GIB = 1 << 30


def prometheus(used: dict[str, int]) -> str:
    """Triton's GPU gauges as /metrics shows them (plus a CPU gauge, which every server has)."""
    lines = ["# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]", "# TYPE nv_cpu_utilization gauge",
             "nv_cpu_utilization 0.25"]
    if used:
        lines += ["# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes", "# TYPE nv_gpu_memory_used_bytes gauge"]
        lines += [f'nv_gpu_memory_used_bytes{{gpu_uuid="{uuid}"}} {value}' for uuid, value in used.items()]
    return "\n".join(lines) + "\n"


class FakeClock:
    """time.monotonic and time.sleep for the meter: sleeping moves the clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@contextmanager
def gauges(state: Callable[[float], dict[str, int]], clock: Callable[[], float], refresh_s: float) -> Iterator[tuple[Endpoint, list[float]]]:
    """Serve ``state(t)`` as of the last refresh tick before the clock's time; yields the endpoint
    and the clock's times of the scrapes."""
    scrapes: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            now = clock()
            scrapes.append(now)
            tick = int(now / refresh_s + 1e-9) * refresh_s
            body = prometheus(state(tick)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Endpoint("127.0.0.1", server.server_address[1]), scrapes
    finally:
        server.shutdown()
        server.server_close()


def meter(endpoint: Endpoint, clock: FakeClock, refresh_s: float, max_settle_s: float = 8.0) -> MemoryMeter:
    return MemoryMeter(endpoint, refresh_s, max_settle_s=max_settle_s, clock=clock, sleep=clock.sleep)


def test_the_baseline_waits_until_the_gauge_stops_falling() -> None:
    """The stub processes free their memory in two steps after the unload; the first readings
    still show the old value (no refresh yet), which must not pass for a settled gauge."""
    clock = FakeClock()

    def state(t: float) -> dict[str, int]:
        return {"GPU-0": 10 * GIB if t < 0.5 else 7 * GIB if t < 1.5 else 4 * GIB}

    with gauges(state, clock, refresh_s=0.5) as (endpoint, scrapes):
        reading, settled = meter(endpoint, clock, 0.5).settled()
    assert reading == {"GPU-0": 4 * GIB} and settled
    # It held for SETTLE_REFRESHES refreshes after the last fall (seen at 1.5 s), then stopped.
    assert scrapes[-1] == pytest.approx(1.5 + SETTLE_REFRESHES * 0.5)


def test_a_gauge_that_keeps_falling_is_waited_for_a_bounded_time() -> None:
    clock = FakeClock()
    with gauges(lambda t: {"GPU-0": int(40 * GIB - t * GIB)}, clock, refresh_s=0.5) as (endpoint, scrapes):
        reading, settled = meter(endpoint, clock, 0.5, max_settle_s=4.0).settled()
    assert not settled and reading["GPU-0"] < 40 * GIB
    assert clock.now == pytest.approx(4.0) and len(scrapes) == 1 + 4.0 / 0.25


def test_reading_after_one_refresh_and_the_trial_arithmetic() -> None:
    """Baseline 1 GiB; two instances load (warm-up) and grow a little during the ramp."""
    clock = FakeClock()
    timeline = {0.0: 1 * GIB, 10.0: 1 * GIB + 2 * 700 * MIB, 20.0: 1 * GIB + 2 * 750 * MIB}

    def state(t: float) -> dict[str, int]:
        return {"GPU-0": timeline[max(k for k in timeline if k <= t)], "GPU-1": 3 * GIB}  # GPU-1: another process

    with gauges(state, clock, refresh_s=0.5) as (endpoint, _):
        m = meter(endpoint, clock, 0.5)
        baseline, settled = m.settled()
        clock.now = 10.0  # the load returned
        loaded = m.refreshed()
        assert loaded is not None and clock.now > 10.5  # the gauge has refreshed since the load
        clock.now = 20.0  # the ramp ended
        ramped = m.refreshed()
    assert ramped is not None
    memory = record(baseline, settled, loaded, ramped, instance_count=2)
    assert (memory.baseline_bytes, memory.after_load_bytes, memory.after_ramp_bytes) == (4 * GIB, 4 * GIB + 1400 * MIB, 4 * GIB + 1500 * MIB)
    assert (memory.model_bytes, memory.per_instance_bytes, memory.instances, memory.gpus) == (1500 * MIB, 750 * MIB, 2, 1)
    assert memory.source == SOURCE and "other processes" in memory.source


def test_instances_on_every_gpu_that_gained_memory_share_it() -> None:
    """A count-2 instance group on a server that sees two GPUs runs 4 instances."""
    memory = record({"a": GIB, "b": GIB}, True, {"a": 3 * GIB, "b": 3 * GIB}, {"a": 3 * GIB, "b": 3 * GIB}, instance_count=2)
    assert (memory.gpus, memory.instances, memory.per_instance_bytes) == (2, 4, GIB)


def test_a_server_without_gpu_gauges_is_asked_once_and_measures_nothing() -> None:
    clock = FakeClock()
    with gauges(lambda t: {}, clock, refresh_s=0.5) as (endpoint, scrapes):
        m = meter(endpoint, clock, 0.5)
        assert m.read() is None and m.settled() is None and m.refreshed() is None
    assert len(scrapes) == 1 and clock.now == 0


def test_an_unreachable_metrics_port_measures_nothing(unused_endpoint: Endpoint) -> None:
    m = MemoryMeter(unused_endpoint, 0.5, sleep=lambda s: None)
    assert m.read() is None and m.settled() is None and m.present is False


@pytest.fixture
def unused_endpoint() -> Endpoint:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return Endpoint("127.0.0.1", s.getsockname()[1])


def _measured(instances: int, per_instance_mib: int) -> GpuMemory:
    return GpuMemory(600 * MIB, 600 * MIB + instances * per_instance_mib * MIB, 600 * MIB + instances * per_instance_mib * MIB,
                     instances, 1)


def test_reports_carry_the_memory_only_where_measured(tmp_path: Path) -> None:
    measured = trial(Candidate(2, 64, (32, 64), 100), [point(1, 500, 2), point(2, 900, 4)])
    measured.gpu_memory = _measured(2, 680)
    old = trial(Candidate(1, 64, (32, 64), 100), [point(1, 400, 2)], baseline=True)
    job = model_tune("digits_fp32", [old, measured])
    doc = tune_document([job], {"slo_p99_ms": 10.0})
    assert doc["trials"][0]["gpu_memory"] is None
    assert doc["best"]["gpu_memory"]["per_instance_bytes"] == 680 * MIB and doc["best"]["gpu_memory"]["model_bytes"] == 1360 * MIB
    write_reports([job], {"slo_p99_ms": 10.0}, tmp_path)
    rows = list(csv.DictReader((tmp_path / "trials.csv").open()))
    assert [(r["gpu_model_mib"], r["gpu_mib_per_instance"]) for r in rows] == [("", ""), ("1360.0", "680.0")]
    assert "GPU MiB/inst" in _text(table([job], 10.0))
    assert "GPU 680 MiB/instance" in progress_line(job, measured, 2, 8) and "GPU" not in progress_line(job, old, 1, 8)
    assert "GPU MiB/inst" not in _text(table([model_tune("digits_fp32", [old])], 10.0))


def _text(renderable: object) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_cache_keeps_the_memory_and_older_entries_have_none() -> None:
    settings = TrialSettings(slo_p99_ms=10.0)
    measured = trial(Candidate(2, 64, (32, 64), 100), [point(1, 500, 2)])
    measured.gpu_memory = _measured(2, 2742)
    back = Trial.from_dict(json.loads(json.dumps(measured.to_dict())), settings)
    assert back.gpu_memory == measured.gpu_memory and back.cached
    older = measured.to_dict()
    del older["gpu_memory"]  # a trial cached before memory was measured
    assert Trial.from_dict(older, settings).gpu_memory is None


@pytest.mark.slow
def test_a_trial_on_a_real_server_unloads_the_model_first_and_measures_its_memory(built: Built, tmp_path: Path) -> None:
    """A real explicit-mode tritonserver (on CPU) unloads and loads the candidates and serves the ramp;
    the GPU gauges it cannot have are stood in for by a local metrics server whose used memory
    follows the real server's state: BASE, plus PER_INSTANCE per instance while the repository index
    lists the model ready, loading or unloading (memory is held until the instances are gone)."""
    import time

    from pipeline.loadtest import payload as pl
    from pipeline.loadtest.client import endpoint_from_url
    from pipeline.loadtest.measure import WindowSettings
    from pipeline.triton.server import TritonServer
    from pipeline.tune.space import candidate_from_config, config_for_candidate
    from pipeline.tune.targets import Target
    from pipeline.tune.trial import Requests, run_trial

    base, per_instance, model = 3 * GIB, 700 * MIB, "digits_fp32"
    seen: dict[str, int] = {"count": 0}

    with TritonServer(built.repository, model_control="explicit", log_path=tmp_path / "triton.log", workdir=tmp_path) as server:
        target = Target(endpoint_from_url(server.http_url), None, {"kind": "test"})

        def state(_: float) -> dict[str, int]:
            _, index = target.call("POST", "/v2/repository/index", {}, timeout=10)
            states = {e.get("state") for e in index if e.get("name") == model}
            if "READY" in states:
                _, config = target.call("GET", f"/v2/models/{model}/config", timeout=10)
                seen["count"] = sum(g["count"] for g in config["instance_group"])
            held = states & {"READY", "LOADING", "UNLOADING"}
            return {"GPU-0": base + (seen["count"] * per_instance if held else 0)}

        with gauges(state, time.monotonic, refresh_s=0.05) as (endpoint, _):
            published = target.model_config(model)
            requests = Requests(target, model, published.max_batch_size, pl.eval_data_path(model, ROOT / "calibration"))
            settings = TrialSettings(slo_p99_ms=1000, max_load=2, fixed_load=1,
                                     windows=WindowSettings(window_s=0.2, warmup_s=0.1, max_s=3.0))
            meter = MemoryMeter(endpoint, 0.05)
            base_candidate = candidate_from_config(published)
            trials = []
            for count in (2, 1):
                candidate = dataclasses.replace(base_candidate, instance_count=count)
                trials.append(run_trial(target, model, config_for_candidate(published, candidate), candidate, requests, settings,
                                        meter=meter))
        ready, _ = target.call("GET", f"/v2/models/{model}/ready", timeout=10)
    assert ready == 200
    for count, t in zip((2, 1), trials):
        assert t.error is None and t.gpu_memory is not None, t.error
        m = t.gpu_memory
        assert (m.baseline_bytes, m.after_load_bytes, m.after_ramp_bytes) == (base, base + count * per_instance, base + count * per_instance)
        assert (m.per_instance_bytes, m.instances, m.gpus, m.settled) == (per_instance, count, 1, True)
        assert t.to_dict()["gpu_memory"]["per_instance_bytes"] == per_instance


def test_metrics_url_is_for_a_remote_server_and_defaults_to_the_http_port_plus_2(tmp_path: Path) -> None:
    from pipeline.tune.targets import Target
    from tests.conftest import cli, one_line_error

    proc = cli("tune", "--model", "digits_fp32", "--slo-p99-ms", "10", "--metrics-url", "127.0.0.1:8002", cwd=tmp_path)
    assert "--metrics-url is for a remote server (--url)" in one_line_error(proc)
    assert list(tmp_path.iterdir()) == []
    assert Target(Endpoint("10.0.0.5", 8000), None, {}).metrics_endpoint == Endpoint("10.0.0.5", 8002)
    assert Target(Endpoint("10.0.0.5", 8000), None, {}, Endpoint("10.0.0.5", 9102)).metrics_endpoint == Endpoint("10.0.0.5", 9102)
