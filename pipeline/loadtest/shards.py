"""A load test from several machines: each shard (a pod of a Kubernetes Indexed Job, or any process
given ``--shard I/N``) runs its share of every point on a schedule shared through the wall clock,
and writes its raw results to a file; :mod:`pipeline.loadtest.merge` combines any set of them.

The schedule: point k of the sweep starts at ``start_at + k × slot`` (wall clock, so the shards'
clocks must agree to well within a window — NTP gives milliseconds), warms up, then runs every
window up to ``--max-seconds`` on the same boundaries (no shard stops early: stability is judged on
the merged windows), drains, and leaves the rest of the slot idle. Shard 0 also reads Triton's
statistics at the window boundaries and around the point, so the merged report carries the
server's counts once.

A shard file (``shard-<i>-of-<n>.npz``) holds one JSON document (``meta``) and, per point and
endpoint, the raw int64 latencies and send lags in nanoseconds (``p<k>_e<i>_lat`` / ``_lag``), with
each window's boundary as positions into them — every sample, so a merge is exact.

``start_at`` is either given (``--start-at TIME``: it must be far enough ahead for the slowest shard to
start) or fixed by a barrier on the shared output folder (``--start-at ready+SECONDS``): each shard, once
its model and workers are ready, writes ``.ready/shard-<i>-of-<n>`` there with its clock, waits until all
``n`` are there, and starts the sweep SECONDS after the last one — every shard reads the same files, so
the schedule is the same, and no guess of the slowest start (pods pulling images) is needed.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import io
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.atomic import write_bytes_atomic, write_text_atomic
from pipeline.core.errors import PipelineError
from pipeline.core.pausepoints import pause_point
from pipeline.loadtest.measure import Measurement, measure
from pipeline.loadtest.policy import OpenLoop, Policy, split
from pipeline.loadtest.runner import LoadTestSettings, model_spec, new_run, shared_memory
from pipeline.loadtest.server_stats import fetch_counters
from pipeline.loadtest.window import Mark
from pipeline.loadtest.workers import EngineSpec, WorkerPool, build_engine

log = logging.getLogger(__name__)

FORMAT = 1
_SETTLE_S = 0.5  # after its drain, shard 0 waits this long before the last server read (the other shards' last requests)
_GAP_S = 1.0  # idle time between two points' slots (clock skew between machines)
READY_PREFIX = "ready+"
_READY_DIR = ".ready"
_READY_POLL_S = 0.05
_READY_WAIT_S = 1800.0  # how long a ready shard waits for the others: pods can wait minutes for a node and an image pull


@dataclass(frozen=True)
class ShardPlan:
    """Which share this process runs and when the sweep starts (seconds since the epoch); with
    ``ready_margin_s`` the start is fixed by the ready barrier (``start_at`` is then set by :func:`start_when_ready`)."""

    index: int
    count: int
    start_at: float
    ready_margin_s: float | None = None

    @property
    def name(self) -> str:
        return f"shard-{self.index}-of-{self.count}"


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` → (I, N), 0 ≤ I < N."""
    try:
        index, count = (int(v) for v in text.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise PipelineError(f"--shard '{text}' is not INDEX/COUNT with 0 ≤ INDEX < COUNT", "e.g. --shard 0/3 (in a Job: --shard $(SHARD_INDEX)/3)")
    return index, count


def parse_start(text: str, now: float | None = None) -> float:
    """``--start-at``: an ISO-8601 time with a zone, seconds since the epoch, or ``+SECONDS`` from now."""
    now = time.time() if now is None else now
    try:
        if text.startswith("+"):
            return now + float(text[1:])
        try:
            return float(text)
        except ValueError:
            moment = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise PipelineError(f"--start-at '{text}' is not a time with a zone", "e.g. --start-at 2026-12-01T21:00:00Z, or +60 (seconds from now)")
    return moment.timestamp()


def parse_ready_margin(text: str) -> float | None:
    """``--start-at ready+SECONDS`` → SECONDS (the sweep starts that long after the last shard is ready); None for a time."""
    if not text.startswith(READY_PREFIX):
        return None
    try:
        margin = float(text[len(READY_PREFIX):])
    except ValueError:
        margin = -1.0
    if not 0 < margin < 3600:
        raise PipelineError(f"--start-at '{text}' is not ready+SECONDS with 0 < SECONDS < 3600", "e.g. --start-at ready+10")
    return margin


def start_when_ready(plan: ShardPlan, out_dir: Path) -> ShardPlan:
    """The ready barrier: say this shard is ready, wait for every shard, and fix the start ``ready_margin_s``
    after the last one was ready (the same time in every shard: they read the same files)."""
    assert plan.ready_margin_s is not None
    ready = out_dir / _READY_DIR
    ready.mkdir(parents=True, exist_ok=True)
    mine = ready / plan.name
    if mine.exists():
        raise PipelineError(f"{mine} already exists: {out_dir} holds another load test's shards",
                            "give every load test its own --shard-output folder")
    pause_point("shard.ready")
    write_text_atomic(mine, repr(time.time()))
    names = [ShardPlan(i, plan.count, 0.0).name for i in range(plan.count)]
    log.info("%s ready; waiting for %d shard(s) in %s", plan.name, plan.count, ready)
    deadline = time.monotonic() + _READY_WAIT_S
    while missing := [n for n in names if not (ready / n).exists()]:
        if time.monotonic() > deadline:
            raise PipelineError(f"{plan.name}: {', '.join(missing)} not ready after {_READY_WAIT_S:.0f} s",
                                "see why those shards did not start (their logs), or start every shard against the same --shard-output")
        time.sleep(_READY_POLL_S)
    last = max(float((ready / n).read_text()) for n in names)
    return ShardPlan(plan.index, plan.count, last + plan.ready_margin_s)


def slot_seconds(settings: LoadTestSettings) -> float:
    """How far apart two points of the shared schedule start."""
    return settings.windows.max_s + settings.windows.drain_s + _SETTLE_S + _GAP_S


def run_shard(settings: LoadTestSettings, plan: ShardPlan, out_dir: Path) -> Path:
    """Run this shard's share of every point on the shared schedule; write and return its file."""
    result = new_run(settings)
    meta: dict[str, Any] = {
        "format": FORMAT, "shard": asdict(plan), "slot_s": slot_seconds(settings), "settings": result.settings, "server": result.server,
        "generator": result.generator, "windows": asdict(_shard_windows(settings)), "points": [],
    }  # fmt: skip
    arrays: dict[str, np.ndarray] = {}
    k = 0
    for model in result.settings["models"]:
        with contextlib.ExitStack() as stack:
            spec = model_spec(settings, model, stack.enter_context(shared_memory(settings)))
            pool = stack.enter_context(WorkerPool(settings.workers, spec)) if settings.workers > 1 else None
            if plan.ready_margin_s is not None:
                plan = start_when_ready(plan, out_dir)
                meta["shard"] = asdict(plan)
            k = _run_points(settings, plan, model, spec, pool, k, meta, arrays)
    return write_shard(out_dir / f"{plan.name}.npz", meta, arrays)


def _run_points(settings: LoadTestSettings, plan: ShardPlan, model: str, spec: EngineSpec, pool: WorkerPool | None,
                k: int, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
    """This shard's share of every point of ``model``, from point ``k`` of the schedule; the next ``k``."""
    windows = _shard_windows(settings)
    slot = slot_seconds(settings)
    for policy in settings.policies:
        begin = plan.start_at + k * slot
        late = time.time() - begin
        if late > 0:
            raise PipelineError(
                f"{plan.name}: point {k + 1} ({model} {policy.label}) was due to start {late:.1f} s ago",
                "give every shard a --start-at far enough ahead for the slowest one to start (pods pull images, models load)",
            )
        share = split(policy, plan.count)[plan.index]
        record: dict[str, Any] = {"model": model, "policy": _policy_dict(policy), "share": share is not None}
        if share is not None:
            fetchers = [functools.partial(fetch_counters, e, model) for e in settings.endpoints] if plan.index == 0 else []
            start_ns = time.perf_counter_ns() + int((begin - time.time()) * 1e9)
            engine = pool.engine(share) if pool is not None else build_engine(spec, share)
            cpu = engine.cpu_seconds if pool is not None else time.process_time
            m = measure(engine, windows, fetchers, cpu=cpu, start_ns=start_ns)
            record.update(_measurement_dict(m, start_ns))
            if pool is not None and engine.failures:
                record["incomplete"] = "; ".join(engine.failures)  # this shard's own worker processes
            for i, r in enumerate(m.recorders):
                arrays[f"p{k}_e{i}_lat"] = np.frombuffer(r.latency_ns, dtype=np.int64)
                arrays[f"p{k}_e{i}_lag"] = np.frombuffer(r.lag_ns, dtype=np.int64)
            log.info("%s %s %s: %d successes, %d errors", plan.name, model, policy.label,
                     sum(len(r.latency_ns) for r in m.recorders), sum(r.error_count for r in m.recorders))
        meta["points"].append(record)
        k += 1
    return k


def write_shard(path: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Path:
    """One ``.npz`` file, written atomically (a merge never reads half a shard)."""
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.array(json.dumps(meta, allow_nan=True)), **arrays)
    try:
        return write_bytes_atomic(path, buffer.getvalue())
    except OSError as exc:
        raise PipelineError(f"cannot write the shard results to {path} ({exc.strerror or exc})",
                            "give --shard-output a writable folder (in Kubernetes: the mounted results volume)") from None


def read_shard(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The meta document and the raw arrays of a shard file."""
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            arrays = {k: data[k] for k in data.files if k != "meta"}
    except (OSError, ValueError, KeyError) as exc:
        raise PipelineError(f"{path} is not a load-test shard file ({exc})", "pass the .npz files written by loadtest --shard, or their folder") from None
    if meta.get("format") != FORMAT:
        raise PipelineError(f"{path} has shard format {meta.get('format')}, this version reads {FORMAT}", "merge with the version that wrote it")
    return meta, arrays


def _shard_windows(settings: LoadTestSettings) -> Any:
    from dataclasses import replace

    return replace(settings.windows, fixed=True, settle_s=_SETTLE_S)


def _policy_dict(policy: Policy) -> dict[str, Any]:
    if isinstance(policy, OpenLoop):
        return {"kind": "request_rate", "rate": policy.rate, "arrivals": policy.arrivals, "seed": policy.seed}
    return {"kind": "concurrency", "concurrency": policy.concurrency}


def _measurement_dict(m: Measurement, start_ns: int) -> dict[str, Any]:
    """Everything of a measurement but the raw arrays; times relative to the point's scheduled start."""
    marks = [m.windows[0].start] + [w.end for w in m.windows] if m.windows else []
    return {
        "marks": [{**asdict(mark), "at_ns": mark.at_ns - start_ns} for mark in marks],
        "recorders": [{"errors": r.errors, "error_samples": r.error_samples, "sent": r.sent, "abandoned": r.abandoned} for r in m.recorders],
        "stable": m.stable, "aborted": m.aborted, "wall_seconds": m.wall_seconds, "unsent": m.unsent,
        "server_window": [None if c is None else asdict(c) for c in m.server_window],
        "server_total": [None if c is None else asdict(c) for c in m.server_total],
        "server_notes": m.server_notes,
    }  # fmt: skip


def mark_from_dict(value: dict[str, Any]) -> Mark:
    """A :class:`Mark` back from a shard file."""
    return Mark(value["at_ns"], value["cpu_s"], *(tuple(value[k]) for k in ("latency_pos", "lag_pos", "errors", "sent")))
