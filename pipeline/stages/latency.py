"""In-process latency of every variant of a build: the median time of one call at batch 1 and at the
largest batch, after warm-up.

ONNX variants run on this machine's CPU in ONNX Runtime sessions set up as each is served (INT8 Q/DQ
with graph optimizations off, exact Q/DQ as Triton's config asks; the CPU INT8 variant and FP32/FP16
with them on), with an explicit intra-op thread count that the report records. TensorRT plans run on
the GPU through the ``tensorrt`` seam. The input is the first evaluation sample repeated to the batch
(cast to each input's dtype): time depends on shapes, not values, for these models.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.accuracy.evaldata import EvalData
from pipeline.backend.trt_seam import TensorRT
from pipeline.core.progress import progress
from pipeline.data.artifacts import Artifact
from pipeline.core.onnx_files import total_size

WARMUP = 2
REPEATS = 7
MIN_REPEATS = 3  # a slow point stops here once POINT_BUDGET_S is spent
POINT_BUDGET_S = 3.0


def cpu_threads() -> int:
    """The CPUs this process may run on (the intra-op thread count the CPU sessions get)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_name() -> str:
    """This machine's CPU model (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def latency_batches(onnx_fp32: Path, data: EvalData, max_batch: int, max_memory_gib: float) -> list[int]:
    """Batch 1 and the largest batch: the build's max batch, capped so that one model holding a batch of the
    largest samples stays within the memory budget."""
    from pipeline.backend.budget import batch_for_budget, memory_estimate

    largest: dict[str, tuple[int, ...]] = {}
    for _, shapes, _ in data.sample_shapes():
        for name, shape in shapes.items():
            old = largest.get(name)
            largest[name] = shape if old is None else tuple(max(a, b) for a, b in zip(old, shape))
    top = batch_for_budget(memory_estimate(onnx_fp32, largest), max_memory_gib, max_batch=max(1, max_batch), runners=1)
    return sorted({1, top})


def latency_report_from_variants(
    variants: Sequence[Artifact],
    data: EvalData,
    dst: Path,
    *,
    batches: Sequence[int],
    threads: int,
    warmup: int = WARMUP,
    repeats: int = REPEATS,
    allow_host_code: bool = False,
    tensorrt: TensorRT | None = None,
) -> dict[str, Any]:
    """Time every variant at each of ``batches`` (plans: those their profiles admit); write ``dst`` (JSON)."""
    sample = data.head(1)
    rows = []
    with progress("latency", len(variants), unit="variants") as bar:
        for artifact in variants:
            rows.append(_variant_latency(artifact, sample, batches, threads, warmup, repeats, allow_host_code, tensorrt))
            bar.advance()
    report = {
        "cpu": cpu_name(),
        "threads": threads,
        "warmup": warmup,
        "repeats": repeats,
        "statistic": "median",
        "inputs": f"the first evaluation sample of {data.source}, repeated to the batch",
        "measured_at": _dt_now(),
        "variants": rows,
    }
    dst.write_text(json.dumps(report, indent=2) + "\n")
    return report


def _variant_latency(artifact: Artifact, sample: Mapping[str, np.ndarray], batches: Sequence[int], threads: int, warmup: int,
                     repeats: int, allow_host_code: bool, tensorrt: TensorRT | None) -> dict[str, Any]:
    row: dict[str, Any] = {"variant": f"{artifact.precision}-{artifact.kind}", "precision": artifact.precision, "kind": artifact.kind,
                           "file": str(artifact.path), "bytes": total_size(artifact.path)}
    if artifact.kind == "plan":
        from pipeline.backend.plan_runner import plan_max_batch, plan_profiles
        from pipeline.stages.accuracy import runner_for_artifact
        from pipeline.stages.engine import metadata_path, read_engine_metadata

        meta = read_engine_metadata(artifact.metadata or metadata_path(artifact.path))
        top = plan_max_batch(plan_profiles(meta))
        usable = sorted({min(b, top) for b in batches} if top is not None else set(batches))
        dtypes = {t["name"]: np.dtype(t["dtype"]) for t in meta.get("inputs", []) if isinstance(t, dict) and "name" in t and "dtype" in t}
        row.update(target="gpu", device=str((meta.get("gpu") or {}).get("name") or "GPU"), runtime=f"TensorRT {meta.get('tensorrt_version', '')}".strip())
        with runner_for_artifact(artifact, tensorrt, allow_host_code) as runner:
            row["batches"] = [_timed(runner.infer, _feed(sample, dtypes, b), b, warmup, repeats) for b in usable]
        return row
    from pipeline.backend.onnxrt import session_from_onnx
    from pipeline.data.tensors import signature_from_onnx

    exact = artifact.precision == "int8"  # as Triton serves it (pipeline.triton.config) and its gate judged it
    session = session_from_onnx(artifact.path, exact_qdq=exact, threads=threads)
    dtypes = {spec.name: np.dtype(spec.dtype) for spec in signature_from_onnx(artifact.path).inputs}
    row.update(target="cpu", device=cpu_name(), threads=threads,
               runtime="ONNX Runtime CPU, graph optimizations " + ("off (exact Q/DQ)" if exact else "on"))
    row["batches"] = [_timed(lambda feed: session.run(None, feed), _feed(sample, dtypes, b), b, warmup, repeats) for b in batches]
    del session
    return row


def _feed(sample: Mapping[str, np.ndarray], dtypes: Mapping[str, np.dtype], batch: int) -> dict[str, np.ndarray]:
    feed = {}
    for name, array in sample.items():
        dtype = dtypes.get(name, array.dtype)
        if np.issubdtype(dtype, np.integer) and not np.issubdtype(array.dtype, np.integer):
            info = np.iinfo(dtype)
            array = np.clip(np.rint(array), info.min, info.max)
        feed[name] = np.ascontiguousarray(np.repeat(array.astype(dtype, copy=False), batch, axis=0))
    return feed


def _timed(call: Callable[[dict[str, np.ndarray]], Any], feed: dict[str, np.ndarray], batch: int, warmup: int, repeats: int) -> dict[str, Any]:
    """The median of ``repeats`` calls after ``warmup`` calls; a slow model (a large one at a large batch) gets one
    warm-up call and stops after MIN_REPEATS calls once they took POINT_BUDGET_S, so a build is not held up for minutes."""
    for _ in range(warmup):
        started = time.perf_counter()
        call(feed)
        if time.perf_counter() - started > POINT_BUDGET_S / MIN_REPEATS:
            break
    times: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        call(feed)
        times.append((time.perf_counter() - started) * 1000.0)
        if len(times) >= MIN_REPEATS and sum(times) >= POINT_BUDGET_S * 1000.0:
            break
    median = statistics.median(times)
    return {"batch": batch, "median_ms": round(median, 4), "min_ms": round(min(times), 4), "max_ms": round(max(times), 4), "calls": len(times),
            "samples_per_s": round(batch / median * 1000.0, 1) if median > 0 else None}


def _dt_now() -> str:
    from pipeline.core.stagecache import now

    return now()
