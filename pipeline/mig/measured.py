"""MIG plans from measurements: `mig-plan --from-tune DIR...`.

Each `tune` run labelled with ``--profile`` measured, on one slice of that profile, the best
serving config of each model and its throughput under the p99 SLO. From those runs this module
gives, per profile, the measured instance count and batching (instead of the ``SMs // 8``
heuristic of :mod:`pipeline.mig.plan`, which stays only for profiles nothing was measured on, and
says so), and ranks the GPU layouts that can be built from the measured profiles (valid
placements of the profile table, :func:`pipeline.mig.layout.layout_of`) by their total
throughput under the SLO: the sum over the layout's slices of each profile's measured capacity.

The whole GPU (MIG off): a run labelled ``--profile whole-gpu`` is the measured capacity of the full
profile (all compute slices, e.g. 7g.141gb). Profiles nothing was measured on then get that capacity
scaled by their share of the SMs (instance count likewise, batching as measured), marked
*estimated* until a slice of theirs is tuned; layouts that use them say so.

GPU memory: a whole-GPU run on a server that exports GPU gauges measured its best config's memory
per instance (`tune`'s ``gpu_memory``: the model's bytes after its load ramp, per instance). The
instance count on each profile is then also capped by what fits in the profile's memory, as the
heuristic plan counts it (:func:`pipeline.mig.plan.budget_bytes`: memory × (1 − HEADROOM_FRACTION)
− PROCESS_OVERHEAD_BYTES, the documented estimates of :mod:`pipeline.mig.memory`). A profile that
cannot hold one instance has no capacity and is left out of the layouts; one that holds fewer
instances than its SM share gets that many, its capacity scaled by the ratio (estimated).

CPU rehearsal: profiles ``cpu-<N>`` are N pinned cores (``tune --cores N --profile cpu-N``); the
layouts are the ways to split this machine's cores into such servers, which answers questions
like "one server on 2 cores, or two servers on 1 core each?" from measurements.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import PipelineError, require
from pipeline.mig.layout import layout_of
from pipeline.mig.memory import HEADROOM_FRACTION, MIB, PROCESS_OVERHEAD_BYTES
from pipeline.mig.plan import SMS_PER_INSTANCE, budget_bytes, compute_limit
from pipeline.mig.profiles import COMPUTE_SLICES, GpuMig, MigProfile

_CPU_PROFILE = re.compile(r"^cpu-(?P<cores>\d+)$")
WHOLE_GPU = "whole-gpu"  # the `tune --profile` label of a run on the unpartitioned GPU


@dataclass(frozen=True)
class Measured:
    """The best config of one model on one profile, from one tune run."""

    profile: str
    model: str
    infer_per_s: float
    p99_ms: float | None
    load: dict[str, float] | None
    config: dict[str, Any]
    meets_slo: bool
    slo_p99_ms: float
    source: Path
    estimated_from: str | None = None  # "16/132 SMs of the whole GPU's measurement" for a scaled estimate
    gpu_bytes_per_instance: int | None = None  # measured by tune (nv_gpu_memory_used_bytes); None: not measured
    memory_fit: int | None = None  # instances that fit in the profile's memory (None: not checked)


@dataclass(frozen=True)
class RankedLayout:
    """A layout (profile → devices) and its total throughput for one model (estimated if any profile is)."""

    model: str
    counts: dict[str, int]
    total_infer_per_s: float
    estimated: bool = False

    @property
    def label(self) -> str:
        """``2x1g.18gb,1x3g.71gb`` style."""
        return ",".join(f"{n}x{p}" for p, n in self.counts.items())


def read_tune_runs(paths: list[Path]) -> list[Measured]:
    """The best of each model of each ``tune.json`` (a run directory or the file itself)."""
    out: list[Measured] = []
    slos = set()
    for path in paths:
        file = path / "tune.json" if path.is_dir() else path
        require(file.is_file(), f"{path} holds no tune.json", "pass the --report-dir of a `tune --profile ...` run")
        try:
            doc = json.loads(file.read_text())
        except ValueError as exc:
            raise PipelineError(f"{file} is not valid JSON ({exc})", "run the tune again") from None
        profile = doc.get("profile")
        require(bool(profile), f"{file} was not labelled with a profile", "tune each slice type with --profile NAME")
        slos.add(doc.get("slo_p99_ms"))
        for model, entry in doc.get("models", {}).items():
            best = entry["best"]
            out.append(Measured(profile, model, float(best["infer_per_s"]) if best["meets_slo"] else 0.0, best.get("p99_ms"),
                                best.get("load"), best["config"], bool(best["meets_slo"]), float(doc["slo_p99_ms"]), file,
                                gpu_bytes_per_instance=_per_instance_bytes(best)))
    require(len(slos) == 1, f"the tune runs used different SLOs ({', '.join(str(s) for s in sorted(slos, key=str))} ms)",
            "compare runs tuned for the same --slo-p99-ms")
    seen: dict[tuple[str, str], Path] = {}
    for m in out:
        key = (m.profile, m.model)
        require(key not in seen, f"{m.model} on {m.profile} was tuned twice ({seen.get(key)} and {m.source})",
                "pass one tune run per profile")
        seen[key] = m.source
    return out


def _per_instance_bytes(best: dict[str, Any]) -> int | None:
    """The measured GPU bytes per instance of a tune.json trial (None: not measured, or nothing on the GPU)."""
    memory = best.get("gpu_memory")
    value = memory.get("per_instance_bytes") if isinstance(memory, dict) else None
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def memory_fit(profile: MigProfile, per_instance_bytes: int) -> int:
    """Instances of ``per_instance_bytes`` that fit in one device of ``profile`` (the model alone on it)."""
    return max(0, budget_bytes(profile) // per_instance_bytes)


def capped_by_memory(m: Measured, profile: MigProfile) -> Measured:
    """``m`` with its instance count capped by ``profile``'s memory (capacity × fit / count, estimated);
    no capacity when not one instance fits. Unchanged without measured memory."""
    if m.gpu_bytes_per_instance is None:
        return m
    fit = memory_fit(profile, m.gpu_bytes_per_instance)
    count = int(m.config["instance_count"])
    if fit >= count:
        return dataclasses.replace(m, memory_fit=fit)
    basis = m.estimated_from or "the whole GPU's measurement"
    return dataclasses.replace(m, memory_fit=fit, infer_per_s=m.infer_per_s * fit / count, p99_ms=None, load=None,
                               config=dict(m.config, instance_count=fit),
                               estimated_from=f"{basis}, {fit} of {count} instances fit in memory" if fit else basis)


def with_whole_gpu_estimates(measured: list[Measured], gpu: GpuMig) -> list[Measured]:
    """``measured`` with each ``whole-gpu`` run as the full profile's measurement, plus, for every profile
    not measured for that model, an estimate scaled from it by SM share (see the module docstring)."""
    full = max(gpu.profiles, key=lambda p: (p.compute_slices, p.sm_count, p.memory_gib))
    require(full.compute_slices == COMPUTE_SLICES, f"{gpu.name} has no profile of all {COMPUTE_SLICES} compute slices",
            "tune one slice of each profile instead of the whole GPU")
    out = [m for m in measured if m.profile != WHOLE_GPU]
    for whole in (m for m in measured if m.profile == WHOLE_GPU):
        done = {m.profile for m in out if m.model == whole.model}
        require(full.name not in done, f"{whole.model} was tuned both on the whole GPU and on {full.name}",
                "pass one of the two runs")
        out.append(capped_by_memory(dataclasses.replace(whole, profile=full.name), full))
        for profile in gpu.profiles:
            if profile.name in done or profile.name == full.name:
                continue
            share = profile.sm_count / full.sm_count
            config = dict(whole.config, instance_count=max(1, round(whole.config["instance_count"] * share)))
            scaled = dataclasses.replace(whole, profile=profile.name, infer_per_s=whole.infer_per_s * share, p99_ms=None, load=None,
                                         config=config, estimated_from=f"{profile.sm_count}/{full.sm_count} SMs of the whole GPU's measurement")
            out.append(capped_by_memory(scaled, profile))
    return out


def is_cpu_rehearsal(measured: list[Measured]) -> bool:
    """Whether every run is a CPU rehearsal profile (``cpu-<cores>``)."""
    return bool(measured) and all(_CPU_PROFILE.match(m.profile) for m in measured)


def rank_layouts(measured: list[Measured], gpu: GpuMig | None, cores: int | None = None) -> list[RankedLayout]:
    """Every layout made only of measured profiles, best total throughput first (per model).

    ``gpu`` None means the CPU rehearsal: a layout is any set of ``cpu-N`` servers whose cores add
    up to at most ``cores`` (default: the CPUs this process may use). Profiles whose memory holds
    no instance of the model (``memory_fit`` 0) are in none of its layouts."""
    ranked: list[RankedLayout] = []
    for model in dict.fromkeys(m.model for m in measured):
        capacity = {m.profile: m.infer_per_s for m in measured if m.model == model and m.memory_fit != 0}
        if not capacity:
            continue
        profiles = list(capacity)
        if gpu is None:
            budget = cores or len(os.sched_getaffinity(0))
            size = {p: int(_CPU_PROFILE.match(p)["cores"]) for p in profiles}  # type: ignore[index]
            limits = [budget // size[p] for p in profiles]
        else:
            limits = [gpu.profile(p).max_instances for p in profiles]
        for counts in itertools.product(*(range(n + 1) for n in limits)):
            if not any(counts):
                continue
            chosen = {p: n for p, n in zip(profiles, counts) if n}
            if gpu is None:
                if sum(size[p] * n for p, n in chosen.items()) > budget:
                    continue
            else:
                try:
                    layout_of([gpu.profile(p) for p, n in chosen.items() for _ in range(n)], gpu)
                except PipelineError:
                    continue
            estimated = any(m.estimated_from for m in measured if m.model == model and m.profile in chosen)
            ranked.append(RankedLayout(model, chosen, sum(capacity[p] * n for p, n in chosen.items()), estimated))
    ranked.sort(key=lambda r: (r.model, -r.total_infer_per_s, sum(r.counts.values())))
    return ranked


def profile_rows(measured: list[Measured], gpu: GpuMig | None) -> list[dict[str, Any]]:
    """Per profile and model: the measured config and capacity; for the GPU's other profiles, the
    heuristic's instance count, marked as not measured."""
    rows = [{"profile": m.profile, "model": m.model, "source": _source(m, gpu), "instances": m.config["instance_count"],
             "max_batch": m.config["max_batch_size"], "preferred": m.config["preferred_batch_sizes"],
             "delay_us": m.config["max_queue_delay_us"], "infer_per_s": m.infer_per_s if m.meets_slo and m.memory_fit != 0 else None,
             "p99_ms": m.p99_ms, "load": m.load,
             "gpu_mib_per_instance": round(m.gpu_bytes_per_instance / MIB) if m.gpu_bytes_per_instance else None,
             "memory_fit": m.memory_fit} for m in measured]
    if gpu is not None:
        done = {m.profile for m in measured}
        for p in gpu.profiles:
            if p.name not in done:
                rows.append({"profile": p.name, "model": "*", "source": f"heuristic (SMs // {SMS_PER_INSTANCE}), not measured",
                             "instances": compute_limit(p), "max_batch": None, "preferred": None, "delay_us": None,
                             "infer_per_s": None, "p99_ms": None, "load": None, "gpu_mib_per_instance": None, "memory_fit": None})
    return rows


def _source(m: Measured, gpu: GpuMig | None) -> str:
    """Where a row's numbers come from (or why the profile holds none)."""
    if m.memory_fit == 0 and gpu is not None and m.gpu_bytes_per_instance:
        return (f"does not fit: {m.gpu_bytes_per_instance / MIB:,.0f} MiB per instance measured, "
                f"{budget_bytes(gpu.profile(m.profile)) / MIB:,.0f} MiB usable")
    return f"estimated: {m.estimated_from}" if m.estimated_from else "measured"


def print_measured_plan(console: Any, measured: list[Measured], gpu: GpuMig | None, top: int = 10) -> list[RankedLayout]:
    """The per-profile table and the ranked layouts; returns the ranking."""
    from rich.table import Table

    runs = measured
    if gpu is not None:
        measured = with_whole_gpu_estimates(measured, gpu)
    slo = measured[0].slo_p99_ms
    rows = profile_rows(measured, gpu)
    memory = any(r["gpu_mib_per_instance"] for r in rows)
    where = "this CPU (cpu-N = a server pinned to N cores)" if gpu is None else gpu.name
    t = Table(title=f"Per profile, from tune runs — {where}, p99 ≤ {slo:g} ms")
    for col in ("profile", "model", "numbers", "instances", *(("GPU MiB/inst (fit)",) if memory else ()), "max batch",
                "preferred", "delay µs", "infer/s under SLO", "p99 ms", "at load"):
        t.add_column(col, justify="left" if col in ("profile", "model", "numbers", "preferred") else "right",
                     no_wrap=col in ("profile", "model"))  # names stay whole; the numbers column wraps instead
    for row in rows:
        load = ", ".join(f"{k} {v:g}" for k, v in row["load"].items()) if row["load"] else "—"
        mem = (_memory_cell(row),) if memory else ()
        t.add_row(row["profile"], row["model"], row["source"], str(row["instances"]), *mem, _cell(row["max_batch"]),
                  ",".join(map(str, row["preferred"])) if row["preferred"] else "—", _cell(row["delay_us"]),
                  f"{row['infer_per_s']:,.0f}" if row["infer_per_s"] is not None else "—", _cell(row["p99_ms"]), load)
    console.print(t)
    ranked = rank_layouts(measured, gpu)
    lt = Table(title="Layouts of measured (or estimated) profiles, ranked by total throughput under the SLO")
    for col in ("model", "rank", "layout", "numbers", "total infer/s", "vs best"):
        lt.add_column(col, justify="left" if col in ("model", "layout") else "right")
    for model in dict.fromkeys(r.model for r in ranked):
        mine = [r for r in ranked if r.model == model]
        for i, r in enumerate(mine[:top], 1):
            lt.add_row(model, str(i), r.label, "estimated" if r.estimated else "measured", f"{r.total_infer_per_s:,.0f}",
                       f"{r.total_infer_per_s / mine[0].total_infer_per_s:.2f}×" if mine[0].total_infer_per_s else "—")
    console.print(lt)
    for model in dict.fromkeys(r.model for r in ranked):
        best = next(r for r in ranked if r.model == model)
        console.print(f"[green]{model}: best {'estimated' if best.estimated else 'measured'} layout {best.label} — "
                      f"{best.total_infer_per_s:,.0f} infer/s under p99 ≤ {slo:g} ms[/]", highlight=False)
    if any(m.estimated_from for m in measured):
        console.print("Estimated profiles scale the whole GPU's measured capacity by their share of the SMs (memory "
                      "bandwidth and per-request overheads do not scale that way): tune one slice of each to measure them.",
                      highlight=False)
    if gpu is not None and any(r["source"].startswith("heuristic") for r in rows):
        console.print("Profiles marked 'not measured' use the SMs // 8 heuristic and are left out of the ranking: "
                      "tune one slice of each to rank layouts with them.", highlight=False)
    if gpu is not None:
        _print_memory_notes(console, runs, measured, ranked)
    return ranked


def _print_memory_notes(console: Any, runs: list[Measured], measured: list[Measured], ranked: list[RankedLayout]) -> None:
    """Say where instance counts were checked against GPU memory, where not, and which models fit nowhere."""
    if any(m.gpu_bytes_per_instance for m in runs):
        console.print(f"Instances are capped by GPU memory: the memory per instance is measured (tune, "
                      f"nv_gpu_memory_used_bytes after the load ramp); a slice's usable memory is its memory × "
                      f"{1 - HEADROOM_FRACTION:.0%} − {PROCESS_OVERHEAD_BYTES // MIB} MiB per server, the documented "
                      "estimates of pipeline/mig/memory.py.", highlight=False)
    unchecked = [m.model for m in runs if m.profile == WHOLE_GPU and m.gpu_bytes_per_instance is None]
    if unchecked:
        console.print(f"GPU memory was not measured for {', '.join(unchecked)} (the tune run's server exported no GPU "
                      "metrics, or the run predates memory measurement), so instance counts are not memory-checked: "
                      "tune on the GPU again with --fresh to measure it.", highlight=False)
    placed = {r.model for r in ranked}
    for m in measured:
        if m.model not in placed and m.gpu_bytes_per_instance:
            placed.add(m.model)
            console.print(f"[red]{m.model}: not one instance fits any profile ({m.gpu_bytes_per_instance / MIB:,.0f} MiB "
                          "per instance measured)[/]", highlight=False)


def _memory_cell(row: dict[str, Any]) -> str:
    """``3,782 (33)``: measured MiB per instance and how many instances fit in the profile's memory."""
    mib = row["gpu_mib_per_instance"]
    return "—" if mib is None else f"{mib:,}" + (f" ({row['memory_fit']})" if row["memory_fit"] is not None else "")


def _cell(value: Any) -> str:
    return "—" if value is None else (f"{value:g}" if isinstance(value, float) else str(value))
