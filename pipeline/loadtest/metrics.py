"""Triton's Prometheus metrics around a load point, beside its statistics extension.

``GET /metrics`` on the metrics port (8002 by default) is scraped when a load point starts and
when it ends, parsed with the Prometheus client library's parser, and the counters subtracted:
inference and execution counts, successes and failures, and the cumulative request, queue and
compute durations (µs) per model. Gauges (CPU and GPU utilization, memory) are read at the end.

Triton exports GPU metrics (``nv_gpu_*``) only for whole GPUs it can see through DCGM; under MIG
it exports none, and a CPU-only server has none either. The report then says so instead of
showing zeros.
"""

from __future__ import annotations

import http.client
import math
from dataclasses import dataclass, field, fields

from pipeline.loadtest.client import Endpoint

# counter name → our field; durations are cumulative microseconds
_COUNTERS = {
    "nv_inference_request_success": "success",
    "nv_inference_request_failure": "failure",
    "nv_inference_count": "inferences",
    "nv_inference_exec_count": "executions",
    "nv_inference_request_duration_us": "request_us",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_input_duration_us": "compute_input_us",
    "nv_inference_compute_infer_duration_us": "compute_infer_us",
    "nv_inference_compute_output_duration_us": "compute_output_us",
}
NO_GPU_METRICS = (
    "the server exports no GPU metrics (nv_gpu_*): a CPU-only server, GPU metrics disabled, or a MIG "
    "instance (Triton exports none under MIG)"
)


@dataclass(frozen=True)
class ModelCounters:
    """Cumulative Prometheus counters of one model (summed over versions and failure reasons)."""

    success: float = 0.0
    failure: float = 0.0
    inferences: float = 0.0
    executions: float = 0.0
    request_us: float = 0.0
    queue_us: float = 0.0
    compute_input_us: float = 0.0
    compute_infer_us: float = 0.0
    compute_output_us: float = 0.0

    def __sub__(self, other: ModelCounters) -> ModelCounters:
        return ModelCounters(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def __add__(self, other: ModelCounters) -> ModelCounters:
        return ModelCounters(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


@dataclass(frozen=True)
class GpuGauges:
    """One GPU's gauges at a moment (utilization 0..1, bytes, watts)."""

    uuid: str
    utilization: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None


@dataclass(frozen=True)
class MetricsSnapshot:
    """What one scrape of ``/metrics`` says."""

    models: dict[str, ModelCounters] = field(default_factory=dict)
    gpus: tuple[GpuGauges, ...] = ()
    cpu_utilization: float | None = None
    cpu_memory_used_bytes: float | None = None


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition format (Triton's ``/metrics``); raises ValueError if it is not."""
    from prometheus_client.parser import text_string_to_metric_families

    models: dict[str, dict[str, float]] = {}
    gpus: dict[str, dict[str, float]] = {}
    cpu: dict[str, float] = {}
    gpu_fields = {"nv_gpu_utilization": "utilization", "nv_gpu_memory_used_bytes": "memory_used_bytes",
                  "nv_gpu_memory_total_bytes": "memory_total_bytes", "nv_gpu_power_usage": "power_watts"}  # fmt: skip
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            if family.name in _COUNTERS and "model" in sample.labels:
                per_model = models.setdefault(sample.labels["model"], {})
                key = _COUNTERS[family.name]
                per_model[key] = per_model.get(key, 0.0) + float(sample.value)
            elif family.name in gpu_fields:
                gpus.setdefault(sample.labels.get("gpu_uuid", "?"), {})[gpu_fields[family.name]] = float(sample.value)
            elif family.name in ("nv_cpu_utilization", "nv_cpu_memory_used_bytes"):
                cpu[family.name] = float(sample.value)
    return MetricsSnapshot(
        models={name: ModelCounters(**values) for name, values in models.items()},
        gpus=tuple(GpuGauges(uuid, **values) for uuid, values in sorted(gpus.items())),
        cpu_utilization=cpu.get("nv_cpu_utilization"),
        cpu_memory_used_bytes=cpu.get("nv_cpu_memory_used_bytes"),
    )


def scrape(endpoint: Endpoint, timeout: float = 2.0) -> MetricsSnapshot:
    """Read and parse ``/metrics``; raises ``OSError`` when it cannot be read or is not Prometheus text."""
    conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read().decode("utf-8", "replace")
    except (TimeoutError, http.client.HTTPException) as exc:
        raise OSError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    if response.status != 200:
        raise OSError(f"/metrics answered HTTP {response.status}")
    try:
        return parse_metrics(body)
    except ValueError as exc:
        raise OSError(f"/metrics is not Prometheus text ({exc})") from None


def point_metrics(before: MetricsSnapshot, after: MetricsSnapshot, model: str) -> dict[str, object]:
    """The report entry of one load point: counter deltas of ``model``, per-request averages (µs),
    and the gauges at the end (or why there are none)."""
    delta = after.models.get(model, ModelCounters()) - before.models.get(model, ModelCounters())
    return summarize(delta, after)


def summarize(delta: ModelCounters, end: MetricsSnapshot | None) -> dict[str, object]:
    """Counts, per-request averages and gauges as plain JSON values."""

    def per_request(total: float) -> float | None:
        return total / delta.success if delta.success else None

    out: dict[str, object] = {
        "inferences": delta.inferences,
        "executions": delta.executions,
        "success": delta.success,
        "failure": delta.failure,
        "avg_batch_size": delta.inferences / delta.executions if delta.executions else None,
        "request_us": per_request(delta.request_us),
        "queue_us": per_request(delta.queue_us),
        "compute_input_us": per_request(delta.compute_input_us),
        "compute_infer_us": per_request(delta.compute_infer_us),
        "compute_output_us": per_request(delta.compute_output_us),
        "cpu_utilization": end.cpu_utilization if end else None,
        "cpu_memory_used_bytes": end.cpu_memory_used_bytes if end else None,
        "gpus": [vars(g) for g in end.gpus] if end else [],
        "gpu_note": "" if end and end.gpus else NO_GPU_METRICS,
    }
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


def combined(snapshots: list[MetricsSnapshot]) -> MetricsSnapshot:
    """The gauges of several servers seen together (their GPUs side by side, the highest CPU figures)."""
    cpu = [s.cpu_utilization for s in snapshots if s.cpu_utilization is not None]
    mem = [s.cpu_memory_used_bytes for s in snapshots if s.cpu_memory_used_bytes is not None]
    return MetricsSnapshot(
        gpus=tuple(g for s in snapshots for g in s.gpus), cpu_utilization=max(cpu, default=None), cpu_memory_used_bytes=max(mem, default=None)
    )


def default_metrics_endpoint(http: Endpoint) -> Endpoint:
    """Triton's default layout (HTTP 8000, gRPC 8001, metrics 8002; `serve --slices` and the MIG
    bundle step all three together): the metrics port is the HTTP port + 2."""
    return Endpoint(http.host, http.port + 2)
