"""``loadtest --merge PATH...``: one report from the shard files of a distributed load test.

Window j of every shard covers the same stretch of the shared schedule, so the merged window j
holds every shard's samples of it; the merged recorders are those samples laid end to end, window
by window, and the point is computed from them by the same code as a one-process run (stability
over the last merged windows, nearest-rank percentiles over every sample of the used windows).
Triton's statistics come from shard 0. A missing shard, or one with fewer windows (it died or
could not reach the server), makes the points it lacks *incomplete*: the others are kept.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.loadtest.client import endpoint_from_url
from pipeline.loadtest.measure import Measurement, WindowSettings
from pipeline.loadtest.policy import ClosedLoop, OpenLoop, Policy
from pipeline.loadtest.recorder import Recorder
from pipeline.loadtest.results import PointResult, RunResult
from pipeline.loadtest.runner import LoadTestSettings, point_from_measurement
from pipeline.loadtest.server_stats import ServerCounters
from pipeline.loadtest.shards import mark_from_dict, read_shard
from pipeline.loadtest.window import Mark, Window, is_stable

# what must be equal in every shard of one load test (anything else is a different test)
_SAME = ("models", "endpoints", "protocol", "encoding", "batch_size", "policies", "window_s", "warmup_s", "max_s_per_point")


def shard_files(paths: list[Path]) -> list[Path]:
    """The shard files among ``paths`` (files, or folders holding ``shard-*.npz``)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(path.glob("shard-*-of-*.npz"))
            if not inside:
                raise PipelineError(f"{path} holds no shard files (shard-<i>-of-<n>.npz)", "pass the folder the shards wrote to (--shard-output)")
            found += inside
        elif path.is_file():
            found.append(path)
        else:
            raise PipelineError(f"{path} does not exist", "pass shard files or the folders that hold them")
    return found


def merge_shards(paths: list[Path]) -> RunResult:
    """One :class:`RunResult` from the shard files at ``paths``."""
    shards = [(p, *read_shard(p)) for p in shard_files(paths)]
    first_path, first, _ = shards[0]
    count = first["shard"]["count"]
    by_index: dict[int, tuple[Path, dict[str, Any], dict[str, np.ndarray]]] = {}
    for path, meta, arrays in shards:
        _require_same(first_path, first, path, meta)
        index = meta["shard"]["index"]
        if index in by_index:
            raise PipelineError(f"{by_index[index][0]} and {path} are both shard {index}", "merge each shard's file once")
        by_index[index] = (path, meta, arrays)
    missing = [i for i in range(count) if i not in by_index]
    settings = _settings(first)
    result = RunResult(
        started=_iso(first["shard"]["start_at"]),
        settings={**first["settings"], "shards": count, "merged_from": [str(p) for p, _, _ in shards]},
        server=first["server"],
        generator={**first["generator"], "processes": f"{len(by_index)} of {count} shards"},
    )
    for k, record in enumerate(first["points"]):
        point = _merge_point(settings, k, record, by_index, count)
        if missing:
            point.incomplete = "; ".join(filter(None, [f"shard(s) {', '.join(map(str, missing))} of {count} missing", point.incomplete]))
        if point.incomplete:
            result.failures.append(f"{point.model} {point.label}: incomplete — {point.incomplete}")
        result.points.append(point)
    return result


def _require_same(first_path: Path, first: dict[str, Any], path: Path, meta: dict[str, Any]) -> None:
    for key in _SAME:
        if meta["settings"].get(key) != first["settings"].get(key):
            raise PipelineError(
                f"cannot merge {first_path} and {path}: they measured different {key.replace('_', ' ')} "
                f"({first['settings'].get(key)} and {meta['settings'].get(key)})",
                "merge the shard files of one load test",
            )
    for key in ("count", "start_at"):
        if meta["shard"][key] != first["shard"][key]:
            raise PipelineError(f"cannot merge {first_path} and {path}: different shard {key} "
                                f"({first['shard'][key]} and {meta['shard'][key]})", "merge the shard files of one load test (one --start-at)")


def _settings(meta: dict[str, Any]) -> LoadTestSettings:
    s, w = meta["settings"], meta["windows"]
    return LoadTestSettings(
        endpoints=tuple(endpoint_from_url(a) for a in s["endpoints"]),
        policies=(),
        protocol=s["protocol"],
        encoding=s["encoding"],
        batch_size=s["batch_size"],
        windows=WindowSettings(window_s=w["window_s"], warmup_s=w["warmup_s"], max_s=w["max_s"],
                               stable_windows=w["stable_windows"], threshold=w["threshold"]),
    )


def _policy(value: dict[str, Any]) -> Policy:
    if value["kind"] == "request_rate":
        return OpenLoop(value["rate"], value["arrivals"], value["seed"])
    return ClosedLoop(value["concurrency"])


def _merge_point(settings: LoadTestSettings, k: int, record: dict[str, Any], shards: dict, count: int) -> PointResult:
    """Point ``k`` of the sweep from every shard that ran a share of it."""
    policy = _policy(record["policy"])
    endpoints = len(settings.endpoints)
    parts = []  # (index, point record, arrays) of the shards with a share
    for index, (_, meta, arrays) in sorted(shards.items()):
        mine = meta["points"][k]
        if mine["model"] != record["model"] or mine["policy"] != record["policy"]:
            raise PipelineError(f"shard {index} has a different point {k + 1}", "merge the shard files of one load test")
        if mine["share"]:
            parts.append((index, mine, arrays))
    notes = []
    full = max((len(p["marks"]) for _, p, _ in parts), default=0)
    for index, p, _ in parts:
        if p.get("incomplete"):
            notes.append(f"shard {index}: {p['incomplete']}")
        if len(p["marks"]) < full:
            notes.append(f"shard {index}: {p['aborted'] or 'fewer windows'} ({max(0, len(p['marks']) - 1)} of {full - 1} windows)")
    marks_n = min((len(p["marks"]) for _, p, _ in parts), default=0)
    recorders = [Recorder() for _ in range(endpoints)]
    latency_pos = [[0] * endpoints for _ in range(marks_n)]
    lag_pos = [[0] * endpoints for _ in range(marks_n)]
    errors = [[0] * endpoints for _ in range(marks_n)]
    sent = [[0] * endpoints for _ in range(marks_n)]
    cpu = [0.0] * marks_n
    for i in range(endpoints):
        for kind, pos_key, target, positions in (("lat", "latency_pos", recorders[i].latency_ns, latency_pos),
                                                 ("lag", "lag_pos", recorders[i].lag_ns, lag_pos)):
            for j in range(marks_n + 1):  # segment j: before mark j (j = marks_n: after the last)
                for _, p, arrays in parts:
                    values = arrays[f"p{k}_e{i}_{kind}"]
                    lo = p["marks"][j - 1][pos_key][i] if j else 0
                    hi = p["marks"][j][pos_key][i] if j < marks_n else len(values)
                    target.frombytes(values[lo:hi].astype(np.int64).tobytes())
                if j < marks_n:
                    positions[j][i] = len(target)
        for _, p, _ in parts:
            r = p["recorders"][i]
            for kind_name, n in r["errors"].items():
                recorders[i].errors[kind_name] = recorders[i].errors.get(kind_name, 0) + n
            for kind_name, samples in r["error_samples"].items():
                recorders[i].error_samples.setdefault(kind_name, samples)
            recorders[i].sent += r["sent"]
            recorders[i].abandoned += r["abandoned"]
            for j in range(marks_n):
                errors[j][i] += p["marks"][j]["errors"][i]
                sent[j][i] += p["marks"][j]["sent"][i]
    for j in range(marks_n):
        cpu[j] = sum(p["marks"][j]["cpu_s"] for _, p, _ in parts)
    at = [parts[0][1]["marks"][j]["at_ns"] for j in range(marks_n)] if parts else []
    marks = [Mark(at[j], cpu[j], tuple(latency_pos[j]), tuple(lag_pos[j]), tuple(errors[j]), tuple(sent[j])) for j in range(marks_n)]
    windows = [Window(a, b) for a, b in zip(marks, marks[1:])]
    m = _measurement(settings, policy, recorders, windows, parts, shards, k)
    point = point_from_measurement(settings, record["model"], policy, m)
    point.incomplete = "; ".join(notes) or None
    point.aggregate.metrics_note = "Prometheus metrics are not read in a sharded run (see Triton's statistics, read by shard 0)"
    for e in point.endpoints:
        e.metrics_note = point.aggregate.metrics_note
    return point


def _measurement(settings: LoadTestSettings, policy: Policy, recorders: list[Recorder], windows: list[Window],
                 parts: list, shards: dict, k: int) -> Measurement:
    w = settings.windows
    throughputs = [x.throughput for x in windows]
    latencies = [x.mean_latency_ns(recorders) for x in windows]
    offered = policy.rate * len(settings.endpoints) if isinstance(policy, OpenLoop) else None
    tail = throughputs[-w.stable_windows:]
    endpoints = len(settings.endpoints)
    zero = shards.get(0)
    own = zero[1]["points"][k] if zero is not None and zero[1]["points"][k]["share"] else None

    def counters(key: str) -> list[ServerCounters | None]:
        if own is None:
            return [None] * endpoints
        return [None if c is None else ServerCounters(**c) for c in own[key]]

    return Measurement(
        recorders=recorders,
        windows=windows,
        stable=is_stable(throughputs, latencies, count=w.stable_windows, threshold=w.threshold),
        overloaded=offered is not None and len(tail) == w.stable_windows and all(t < (1 - w.threshold) * offered for t in tail),
        aborted=next((p["aborted"] for _, p, _ in parts if p["aborted"]), None) if len(parts) and all(p["aborted"] for _, p, _ in parts) else None,
        wall_seconds=max((p["wall_seconds"] for _, p, _ in parts), default=0.0),
        unsent=[sum(p["unsent"][i] for _, p, _ in parts) for i in range(endpoints)],
        server_window=counters("server_window"),
        server_total=counters("server_total"),
        server_notes=own["server_notes"] if own is not None else ["Triton's statistics are read by shard 0, whose results are missing"] * endpoints,
    )


def _iso(epoch: float) -> str:
    return _dt.datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")
