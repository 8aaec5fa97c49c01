"""A load test from settings to results: for each model, encode its requests once, check one
against tritonclient, then measure every load point of the sweep on every endpoint at once."""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.progress import progress
from pipeline.data.raw_files import is_image_folder, is_text_file
from pipeline.data.uint8_wire import quantized, served_uint8_scales
from pipeline.loadtest import payload as pl
from pipeline.loadtest import metrics as pm
from pipeline.loadtest.client import Endpoint, post_request_bytes
from pipeline.loadtest.measure import (
    Measurement,
    WindowSettings,
    measure,
    window_lags,
    window_latencies,
)
from pipeline.loadtest.policy import OpenLoop, Policy
from pipeline.loadtest.request_check import check_request, check_shm_request
from pipeline.loadtest.results import EndpointResult, PointResult, RunResult
from pipeline.loadtest.server_stats import ServerCounters, ensemble_steps, fetch_counters, step_counters
from pipeline.loadtest.shm import SHARED_MEMORY, SharedMemoryRegions, output_byte_sizes, shm_requests
from pipeline.loadtest.stats import summarize_ns
from pipeline.loadtest.targets import (
    model_io,
    ready_models,
    require_ready,
    server_metadata,
)
from pipeline.loadtest.window import spread
from pipeline.loadtest.workers import EngineSpec, WorkerPool, build_engine

log = logging.getLogger(__name__)

PROTOCOLS = ("http", "grpc")


@dataclass(frozen=True)
class LoadTestSettings:
    """Everything a load test needs besides the server."""

    endpoints: tuple[Endpoint, ...]  # HTTP: control plane and statistics always, load for protocol http
    policies: tuple[Policy, ...]
    grpc_endpoints: tuple[Endpoint, ...] = ()  # load for protocol grpc, one per HTTP endpoint
    models: tuple[str, ...] = ()  # empty: every ready model
    batch_size: int = 1
    protocol: str = "http"
    encoding: str = "binary"
    windows: WindowSettings = field(default_factory=WindowSettings)
    timeout_s: float = 5.0
    max_connections: int = 256
    data: Path | None = None
    calibration_dir: Path = Path("calibration")
    repository: Path | None = None  # where the builds recorded their evaluation data (embedded server's repository)
    distinct_requests: int = 16
    metrics_endpoints: tuple[Endpoint | None, ...] = ()  # Prometheus /metrics per HTTP endpoint (None: not scraped)
    workers: int = 1  # load-generating processes on this machine (pipeline.loadtest.workers)
    shared_memory: str = "none"  # tensors through shared memory (pipeline.loadtest.shm.SHARED_MEMORY)
    output_shm_size: int | None = None  # bytes per output region (None: from the model's output shapes)

    @property
    def transport(self) -> str:
        """How tensors travel, as the reports name it."""
        if self.shared_memory != "none":
            return f"{self.shared_memory}-shm"
        return self.encoding if self.protocol == "http" else "protobuf"


def run_loadtest(settings: LoadTestSettings) -> RunResult:
    """Measure every model × load point; stops early (with a failure noted) if a server dies."""
    result = new_run(settings)
    for model in result.settings["models"]:
        if not _run_model(settings, model, result):
            break
    return result


def new_run(settings: LoadTestSettings) -> RunResult:
    """Check the settings and the servers (every model ready everywhere); the run's empty result."""
    if settings.protocol not in PROTOCOLS:
        raise PipelineError(f"unknown --protocol '{settings.protocol}'", f"use one of: {', '.join(PROTOCOLS)}")
    if settings.shared_memory not in SHARED_MEMORY:
        raise PipelineError(f"unknown --shared-memory '{settings.shared_memory}'", f"use one of: {', '.join(SHARED_MEMORY)}")
    if settings.protocol == "grpc" and len(settings.grpc_endpoints) != len(settings.endpoints):
        raise PipelineError("--protocol grpc needs one gRPC address per --url", "pass --grpc-url once for every --url")
    meta = {e.address: server_metadata(e) for e in settings.endpoints}
    models = list(settings.models) or ready_models(settings.endpoints[0])
    if not models:
        raise PipelineError(f"Triton at {settings.endpoints[0].address} has no ready model", "load models, or check its log")
    first = next(iter(meta.values()), {})
    result = RunResult(
        started=_dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        settings=_settings_dict(settings, models),
        server={"name": first.get("name"), "version": first.get("version"), "endpoints": list(meta)},
        generator=_generator_info(settings),
    )
    for model in models:
        for endpoint in settings.endpoints:
            require_ready(endpoint, model)
    return result


def _run_model(settings: LoadTestSettings, model: str, result: RunResult) -> bool:
    """Run the sweep of one model; False when the run must stop (a server is gone)."""
    with contextlib.ExitStack() as stack, progress(f"load test {model}", len(settings.policies), unit="points", summary=False) as bar:
        regions = stack.enter_context(shared_memory(settings))
        spec = model_spec(settings, model, regions)
        pool = stack.enter_context(WorkerPool(settings.workers, spec)) if settings.workers > 1 else None
        for policy in bar.track(settings.policies):  # each point logs its line
            bar.note(policy.label)
            point = _run_point(settings, model, policy, spec, pool, regions.ensure_registered if regions is not None else None)
            result.points.append(point)
            if not _point_done(settings, model, point, result):
                return False
            if point.aborted:
                return True
    return True


def shared_memory(settings: LoadTestSettings) -> contextlib.AbstractContextManager[SharedMemoryRegions | None]:
    """The regions the requests will name (a context that removes them), or nothing without shared memory."""
    if settings.shared_memory == "none":
        return contextlib.nullcontext()
    return SharedMemoryRegions(settings.shared_memory, list(settings.endpoints))


def model_spec(settings: LoadTestSettings, model: str, regions: SharedMemoryRegions | None = None) -> EngineSpec:
    """The engine's requests for ``model``: samples encoded once (their tensors written into ``regions``
    with shared memory), the first checked against tritonclient."""
    io = model_io(settings.endpoints[0], model)
    if settings.data is not None and (is_image_folder(settings.data) or is_text_file(settings.data)):  # for a raw-input ensemble
        files = (pl.raw_text_requests(settings.data, io, settings.batch_size, settings.distinct_requests) if is_text_file(settings.data)
                 else pl.raw_file_requests(settings.data, io, settings.distinct_requests))
        log.info("%s: %d raw requests from %s, %s/%s", model, len(files), settings.data, settings.protocol, settings.transport)
        return EngineSpec(settings.protocol, _targets(settings, io, files, regions), settings.timeout_s, settings.max_connections)
    samples = pl.load_samples(settings.data or pl.eval_data_path(model, settings.calibration_dir, settings.repository))
    if settings.repository is not None:  # a uint8-input variant gets its float samples as the uint8 a client sends
        samples = quantized(samples, served_uint8_scales(settings.repository / model))
    floats = [t.name for t in io.inputs if t.datatype == "UINT8" and any(
        (k == t.name or k.startswith(t.name + "__")) and v.dtype.kind == "f" for k, v in samples.items())]
    if floats:  # casting would send every value below 1.0 as 0: the scale lives only in the model file
        raise PipelineError(
            f"model '{model}' takes {', '.join(floats)} as uint8 (a --uint8-input variant) and the samples are float; "
            "without the model file the scale that turns them into uint8 is unknown",
            "pass --repository with the published repository (the scale is read from the model), or --data with uint8 samples",
        )
    batches = pl.request_batches(samples, io, settings.batch_size, settings.distinct_requests)
    log.info("%s: %d distinct requests of batch %d, %s/%s, %d process(es)", model, len(batches), settings.batch_size,
             settings.protocol, settings.transport, settings.workers)
    return EngineSpec(settings.protocol, _targets(settings, io, batches, regions), settings.timeout_s, settings.max_connections)


def _run_point(
    settings: LoadTestSettings, model: str, policy: Policy, spec: EngineSpec, pool: WorkerPool | None,
    after_disruption: Callable[[], bool] | None = None,
) -> PointResult:
    """Measure one load point, with Triton's Prometheus metrics scraped when it starts and ends."""
    log.debug("%s: %s", model, policy.label)
    engine = pool.engine(policy) if pool is not None else build_engine(spec, policy)
    fetchers = [functools.partial(fetch_counters, e, model) for e in settings.endpoints]
    offered = policy.rate * len(spec.targets) if isinstance(policy, OpenLoop) else None
    scraped_ns = time.perf_counter_ns()
    before = [_scrape(m) for m in _metrics_endpoints(settings)]
    cpu = engine.cpu_seconds if pool is not None else time.process_time
    steps = ensemble_steps(settings.endpoints[0], model)
    steps_before = _step_counters(settings, steps)
    measurement = measure(engine, settings.windows, fetchers, offered, cpu=cpu, after_disruption=after_disruption)
    steps_after = _step_counters(settings, steps)
    after = [_scrape(m) for m in _metrics_endpoints(settings)]
    point = point_from_measurement(settings, model, policy, measurement)
    # over the whole point, warm-up windows included: Triton counts per model, not per window of ours; left out when a
    # server could not be asked or restarted in between (its counters started again)
    if steps_before and steps_after and all(steps_after[s].success_count >= steps_before[s].success_count for s in steps):
        point.steps = {step: (steps_after[step] - steps_before[step]).breakdown() for step in steps}
    if pool is not None:
        point.incomplete = "; ".join(engine.failures) or None
    _attach_metrics(point, model, before, after, (time.perf_counter_ns() - scraped_ns) / 1e9)
    return point


def _step_counters(settings: LoadTestSettings, steps: list[str]) -> dict[str, ServerCounters]:
    """Each ensemble step's counters now ({} without steps, or when a server cannot be asked)."""
    if not steps:
        return {}
    try:
        return step_counters(list(settings.endpoints), steps)
    except OSError as exc:
        log.warning("per-step server times left out: %s", exc)
        return {}


def _point_done(settings: LoadTestSettings, model: str, point: PointResult, result: RunResult) -> bool:
    """Log the point; note an aborted one. False when the run must stop (a server is gone)."""
    agg = point.aggregate
    log.info(
        "%s %s: %.1f infer/s, p50 %.2f ms, p99 %.2f ms, %d errors%s%s",
        model, point.label, agg.infer_per_s, agg.latency.p50_ms, agg.latency.p99_ms, agg.error_count,
        " (overloaded: below the offered rate)" if point.overloaded else ("" if point.stable else " (not stable)"), f" — aborted: {point.aborted}" if point.aborted else "",
    )
    for window in point.disrupted:
        log.warning("%s %s: %s — left out of the statistics", model, point.label, window)
    if point.incomplete:
        result.failures.append(f"{model} {point.label}: incomplete — {point.incomplete}; the other workers' results are kept")
    if point.aborted:
        for endpoint in settings.endpoints:
            try:
                server_metadata(endpoint)
            except PipelineError as exc:
                result.failures.append(f"{model} {point.label}: {point.aborted}; then {exc.problem}")
                return False
        result.failures.append(f"{model} {point.label}: {point.aborted}; rest of this model's sweep skipped")
    return True


def _metrics_endpoints(settings: LoadTestSettings) -> list[Endpoint | None]:
    return list(settings.metrics_endpoints) or [None] * len(settings.endpoints)


def _scrape(endpoint: Endpoint | None) -> pm.MetricsSnapshot | str:
    """A snapshot of ``/metrics``, or why there is none."""
    if endpoint is None:
        return "Prometheus metrics not scraped (no metrics address; pass --metrics-url)"
    try:
        return pm.scrape(endpoint)
    except OSError as exc:
        return f"Prometheus metrics at {endpoint.address} unavailable: {exc}"


def _attach_metrics(
    point: PointResult, model: str, before: list[pm.MetricsSnapshot | str], after: list[pm.MetricsSnapshot | str], seconds: float
) -> None:
    """Per endpoint and aggregated: counter deltas over the point and the gauges at its end.

    The deltas span the whole point (warm-up, every window, drain: ``seconds``), not the last
    windows the load table's infer/s is computed from; each summary says its interval and rate."""
    deltas, ends = [], []
    for result, start, end in zip(point.endpoints, before, after):
        if isinstance(start, str) or isinstance(end, str):
            result.metrics_note = start if isinstance(start, str) else str(end)
            continue
        delta = end.models.get(model, pm.ModelCounters()) - start.models.get(model, pm.ModelCounters())
        result.metrics = _over(pm.summarize(delta, end), seconds)
        deltas.append(delta)
        ends.append(end)
    if len(point.endpoints) == 1:
        point.aggregate.metrics, point.aggregate.metrics_note = point.endpoints[0].metrics, point.endpoints[0].metrics_note
    elif deltas and len(deltas) == len(point.endpoints):
        point.aggregate.metrics = _over(pm.summarize(sum(deltas, pm.ModelCounters()), pm.combined(ends)), seconds)
    else:
        point.aggregate.metrics_note = "; ".join(e.metrics_note for e in point.endpoints if e.metrics_note)


def _over(summary: dict[str, Any], seconds: float) -> dict[str, Any]:
    inferences = summary.get("inferences")
    return {**summary, "seconds": seconds, "infer_per_s": inferences / seconds if isinstance(inferences, (int, float)) and seconds > 0 else None}


def _targets(
    settings: LoadTestSettings, io: pl.ModelIO, batches: list[dict[str, np.ndarray]], regions: SharedMemoryRegions | None = None
) -> list[tuple[Endpoint, list[bytes]]]:
    """Per endpoint, the pre-encoded requests; the first is checked against tritonclient."""
    if settings.protocol == "grpc":
        return _grpc_targets(settings, io, batches, regions)
    path = f"/v2/models/{io.name}/infer"
    if regions is not None:
        shm = shm_requests(io, batches, regions, output_byte_sizes(io, settings.batch_size, settings.output_shm_size))
        targets = [(e, [post_request_bytes(e, path, body) for body in shm.bodies]) for e in settings.endpoints]
        check_shm_request(settings.endpoints[0], io, targets[0][1][0], batches[0], regions, shm.outputs)
        return targets
    encoded = [pl.encode(io, b, settings.encoding) for b in batches]
    targets = [(e, [post_request_bytes(e, path, body, head) for body, head in encoded]) for e in settings.endpoints]
    check_request(settings.endpoints[0], io, targets[0][1][0], batches[0])
    return targets


def _grpc_targets(
    settings: LoadTestSettings, io: pl.ModelIO, batches: list[dict[str, np.ndarray]], regions: SharedMemoryRegions | None
) -> list[tuple[Endpoint, list[bytes]]]:
    """Per gRPC endpoint, the pre-serialized requests (naming shared-memory slots with ``regions``); the first checked."""
    from pipeline.loadtest.grpc_load import check_grpc_request, check_grpc_shm_request, grpc_request_bytes, grpc_shm_request_bytes

    if regions is None:
        bodies = [grpc_request_bytes(io, b) for b in batches]
        check_grpc_request(settings.grpc_endpoints[0], io, bodies[0], batches[0])
    else:  # the regions are the server's, registered through its HTTP endpoint: gRPC requests name them too
        shm = shm_requests(io, batches, regions, output_byte_sizes(io, settings.batch_size, settings.output_shm_size))
        bodies = [grpc_shm_request_bytes(io, b, slots, shm.outputs) for b, slots in zip(batches, shm.inputs, strict=True)]
        check_grpc_shm_request(settings.grpc_endpoints[0], io, bodies[0], batches[0], regions, shm.outputs)
    return [(e, bodies) for e in settings.grpc_endpoints]


def point_from_measurement(settings: LoadTestSettings, model: str, policy: Policy, m: Measurement) -> PointResult:
    """Summaries of the used windows, per endpoint and aggregated."""
    used_count = m.usable(settings.windows.stable_windows)
    used = m.used(used_count)
    seconds = (used[-1].end.at_ns - used[0].start.at_ns) / 1e9 if used else 0.0
    open_loop = isinstance(policy, OpenLoop)
    endpoints = []
    for i, recorder in enumerate(m.recorders):
        lat = window_latencies(m, used_count, i)
        counters = m.server_window[i]
        total = m.server_total[i]
        endpoints.append(
            EndpointResult(
                endpoint=settings.endpoints[i].address,
                requests=int(lat.size),
                seconds=seconds,
                batch_size=settings.batch_size,
                latency=summarize_ns(lat),
                send_lag=summarize_ns(window_lags(m, used_count, i)) if open_loop else None,
                errors=dict(recorder.errors),
                error_samples={k: list(v) for k, v in recorder.error_samples.items()},
                server=counters.breakdown() if counters is not None else None,
                server_note=m.server_notes[i],
                client_successes_total=len(recorder.latency_ns),
                server_successes_total=total.success_count if total is not None else None,
                unsent=m.unsent[i],
                abandoned=recorder.abandoned,
            )
        )
    aggregate = _aggregate(endpoints, m, used_count, seconds, settings.batch_size, open_loop)
    window_spread = {
        "throughput": spread([w.throughput for w in used]),
        "latency": spread([w.mean_latency_ns(m.recorders) for w in used]),
    }
    requests = sum(w.successes + w.errors for w in used)
    cpu = (used[-1].end.cpu_s - used[0].start.cpu_s) if used else 0.0
    return PointResult(
        model=model,
        protocol=settings.protocol,
        encoding=settings.transport,
        policy=policy.kind,
        load=policy.value,
        arrivals=policy.arrivals if isinstance(policy, OpenLoop) else None,
        batch_size=settings.batch_size,
        stable=m.stable,
        overloaded=m.overloaded,
        windows=len(m.windows),
        used_windows=used_count,
        wall_seconds=m.wall_seconds,
        client_cpu_us_per_request=cpu / requests * 1e6 if requests else float("nan"),
        aggregate=aggregate,
        endpoints=endpoints,
        aborted=m.aborted,
        window_spread=window_spread,
        disrupted=list(m.disrupted),
    )


def _aggregate(parts: list[EndpointResult], m: Measurement, used: int, seconds: float, batch: int, open_loop: bool) -> EndpointResult:
    if len(parts) == 1:
        only = parts[0]
        return EndpointResult(**{**only.__dict__, "endpoint": "all"})
    errors: dict[str, int] = {}
    samples: dict[str, list[str]] = {}
    for p in parts:
        for kind, n in p.errors.items():
            errors[kind] = errors.get(kind, 0) + n
            samples.setdefault(kind, p.error_samples.get(kind, []))
    window_counters = [c for c in m.server_window if c is not None]
    totals = [c for c in m.server_total if c is not None]
    lags = np.concatenate([window_lags(m, used, i) for i in range(len(parts))]) if open_loop else None
    return EndpointResult(
        endpoint="all",
        requests=sum(p.requests for p in parts),
        seconds=seconds,
        batch_size=batch,
        latency=summarize_ns(window_latencies(m, used)),
        send_lag=summarize_ns(lags) if lags is not None else None,
        errors=errors,
        error_samples=samples,
        server=sum(window_counters, ServerCounters()).breakdown() if len(window_counters) == len(parts) else None,
        server_note="; ".join(p.server_note for p in parts if p.server_note),
        client_successes_total=sum(p.client_successes_total for p in parts),
        server_successes_total=sum(c.success_count for c in totals) if len(totals) == len(parts) else None,
        unsent=sum(p.unsent for p in parts),
        abandoned=sum(p.abandoned for p in parts),
    )


def _settings_dict(s: LoadTestSettings, models: list[str]) -> dict[str, Any]:
    return {
        "models": models,
        "endpoints": [e.address for e in s.endpoints],
        "grpc_endpoints": [e.address for e in s.grpc_endpoints],
        "protocol": s.protocol,
        "encoding": s.encoding,
        "shared_memory": s.shared_memory,
        "batch_size": s.batch_size,
        "policies": [p.label for p in s.policies],
        "window_s": s.windows.window_s,
        "warmup_s": s.windows.warmup_s,
        "max_s_per_point": s.windows.max_s,
        "stability": f"last {s.windows.stable_windows} windows within {s.windows.threshold:.0%}",
        "stability_threshold": s.windows.threshold,
        "timeout_s": s.timeout_s,
        "data": str(s.data) if s.data else None,
        "workers": s.workers,
    }


def _generator_info(s: LoadTestSettings) -> dict[str, Any]:
    engine = (
        "HTTP/2 gRPC framed in an epoll loop, pre-serialized ModelInferRequest, one connection per endpoint"
        if s.protocol == "grpc"
        else "epoll loop, HTTP/1.1 keep-alive, one connection per in-flight request, pre-encoded requests"
    )
    return {"engine": engine, "python": platform.python_version(), "processes": s.workers}
