"""What a tune reports: progress lines, the trial table, ``tune.json``, ``trials.csv``,
``throughput_vs_p99.png`` and, for several precision variants of one model, the accuracy /
throughput Pareto front (``pareto.png`` and a table; dominated variants marked)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from pipeline.data.artifacts import VARIANT_NAME
from pipeline.tune.gpu_memory import MIB
from pipeline.tune.trial import Trial
from pipeline.tune.tuner import ModelTune, summary


def progress_line(job: ModelTune, trial: Trial, number: int, max_trials: int) -> str:
    """One line per finished trial, for the screen."""
    d = trial.to_dict()
    if trial.error:
        result = f"[red]failed: {trial.error}[/]"
    elif trial.meets_slo:
        load = next(iter(d["load"].items()))
        result = f"{d['infer_per_s']:,.0f} infer/s at {load[0]} {load[1]:g}, p99 {d['p99_ms']:.2f} ms"
    elif trial.load_kind == "target_qps":  # LoadGen's verdict, and why, rather than the p99 alone
        closest = trial.closest_point or {}
        why = "; ".join(r.split(" (")[0] for r in closest.get("reasons", [])) or "INVALID"
        result = f"[yellow]no target QPS is VALID[/] (at {closest.get('load', 0):g}: p99 {d['p99_ms']} ms, {why})"
    else:
        result = f"[yellow]no load meets p99 ≤ {trial.slo_p99_ms:g} ms[/] (lowest p99 {d['p99_ms']} ms)"
    if trial.gpu_memory is not None:
        result += f", GPU {_mib(trial.gpu_memory.per_instance_bytes)} MiB/instance"
    best = " [green]★ best so far[/]" if job.best is trial and not trial.error else ""
    tag = " (cached)" if trial.cached else f" ({trial.seconds:.0f} s)"
    kind = "published" if trial.baseline else "candidate"
    return f"[{number}/{max_trials}] {job.model} {kind} {trial.candidate.label} → {result}{tag}{best}"


def _mib(n: int) -> str:
    return f"{n / MIB:,.0f}"


def table(jobs: list[ModelTune], slo_p99_ms: float) -> Any:
    """The rich table of every trial: knobs, throughput under the SLO, p99, fixed-load latency, and
    GPU memory per instance when some trial measured it."""
    from rich.table import Table

    memory = any(t.gpu_memory is not None for job in jobs for t in job.trials)
    server = any(t.load_kind == "target_qps" for job in jobs for t in job.trials)  # tune --scenario server: LoadGen's terms
    title = f"highest VALID MLPerf Server target QPS, latency bound {slo_p99_ms:g} ms" if server else f"throughput under p99 ≤ {slo_p99_ms:g} ms"
    t = Table(title=f"tune: {title} (★ best, ● published)")
    for col in ("model", "#", "instances", "max batch", "preferred", "delay µs", "samples/s" if server else "infer/s", "p99 ms",
                "VALID QPS" if server else "at load", "first-point p99 ms" if server else "fixed-load p99 ms", *(("GPU MiB/inst",) if memory else ()),
                "VALID" if server else "meets SLO", "source"):
        # Model names are never cut: the column is as wide as the longest.
        width = max((len(job.model) for job in jobs), default=5) if col == "model" else None
        t.add_column(col, justify="left" if col in ("model", "preferred", "source") else "right", min_width=width)
    for job in jobs:
        best = job.best
        for i, trial in enumerate(job.trials, 1):
            d = trial.to_dict()
            c = trial.candidate
            marks = ("★" if trial is best else "") + ("●" if trial.baseline else "")
            load = f"{next(iter(d['load'].values())):g}" if d["load"] else "—"
            fixed = d["fixed_load"]["p99_ms"] if d["fixed_load"] else None
            t.add_row(job.model, f"{marks}{i}", str(c.instance_count), str(c.max_batch_size),
                      ",".join(map(str, c.preferred_batch_sizes)) or "—", str(c.max_queue_delay_us),
                      f"{d['infer_per_s']:,.0f}" if trial.meets_slo else "—", _num(d["p99_ms"]), load, _num(fixed),
                      *((_mib(trial.gpu_memory.per_instance_bytes) if trial.gpu_memory else "—",) if memory else ()),
                      "yes" if trial.meets_slo else ("error" if trial.error else "no"),
                      "cache" if trial.cached else f"measured {trial.seconds:.0f} s")
    return t


def _num(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "—"


def accuracy_of(model: str, model_dir: Path | None, workdir: Path = Path("build")) -> dict[str, Any] | None:
    """The accuracy of a variant (``top1``, and what it is: ``metric``) from its build's accuracy report: the publish record in the
    repository (``.pipeline-report.json``), else ``<workdir>/<name>/accuracy.json``."""
    m = VARIANT_NAME.match(model)
    if m is None:
        return None
    kind = "plan" if m["trt"] else "onnx"
    report = None
    if model_dir is not None and (model_dir / ".pipeline-report.json").is_file():
        try:
            versions = json.loads((model_dir / ".pipeline-report.json").read_text())["versions"]
            report = (versions[max(versions, key=int)].get("build") or {}).get("accuracy")
        except (ValueError, KeyError, TypeError):
            report = None
    path = workdir / m["base"] / "accuracy.json"
    source = f"{model_dir}/.pipeline-report.json" if report else str(path)
    if report is None and path.is_file():
        try:
            report = json.loads(path.read_text())
        except ValueError:
            report = None
    if not isinstance(report, dict):
        return None
    for variant in report.get("variants", []):
        if variant.get("precision") == m["precision"] and variant.get("kind") == kind and variant.get("accuracy") is not None:
            return {"top1": variant["accuracy"], "metric": variant.get("accuracy_metric"), "source": source}
    if m["precision"] == "fp32" and kind == "onnx" and str(report.get("reference", "")).startswith("fp32"):
        judged = next((v for v in report.get("variants", []) if v.get("reference_accuracy") is not None), None)
        if judged is not None:
            return {"top1": judged["reference_accuracy"], "metric": judged.get("accuracy_metric"), "source": source + " (reference)"}
    return None


def pareto(jobs: list[ModelTune], workdir: Path = Path("build")) -> list[dict[str, Any]]:
    """One point per variant: accuracy and best throughput under the SLO; ``dominated`` when another
    variant is at least as accurate and at least as fast (and better in one)."""
    points: list[dict[str, Any]] = []
    for job in jobs:
        accuracy = accuracy_of(job.model, job.model_dir, workdir)
        best = job.best
        points.append({"model": job.model, "top1": accuracy["top1"] if accuracy else None,
                       "accuracy_metric": accuracy["metric"] if accuracy else None, "accuracy_source": accuracy["source"] if accuracy else None,
                       "infer_per_s": best.to_dict()["infer_per_s"] if best.meets_slo else 0.0,
                       "config": best.candidate.to_dict()})
    for p in points:
        p["dominated"] = p["top1"] is not None and any(q is not p and _dominates(q, p) for q in points)
    return points


def _dominates(q: dict[str, Any], p: dict[str, Any]) -> bool:
    """At least as accurate and as fast, and better in one of the two."""
    if q["top1"] is None:
        return False
    a, b = (float(q["top1"]), float(q["infer_per_s"])), (float(p["top1"]), float(p["infer_per_s"]))
    return a[0] >= b[0] and a[1] >= b[1] and a != b


def accuracy_name(points: list[dict[str, Any]]) -> str:
    """What the points' accuracy is ("top-1", "R²", "mIoU": the build's ``accuracy_metric``), or "accuracy" when
    they differ or a report does not say (the key stays ``top1`` in tune.json for its readers)."""
    named = {p.get("accuracy_metric") for p in points if p["top1"] is not None}
    return str(next(iter(named))) if len(named) == 1 and None not in named else "accuracy"


def pareto_table(points: list[dict[str, Any]], slo_p99_ms: float) -> Any:
    """The Pareto points as a rich table."""
    from rich.table import Table

    t = Table(title=f"accuracy vs throughput under p99 ≤ {slo_p99_ms:g} ms (one point per variant)")
    measure = accuracy_name(points)
    for col in ("variant", measure, "infer/s", "config", "Pareto"):
        t.add_column(col, justify="right" if col in (measure, "infer/s") else "left")
    for p in points:
        c = p["config"]
        t.add_row(p["model"], f"{p['top1']:.2%}" if p["top1"] is not None else "unknown", f"{p['infer_per_s']:,.0f}",
                  f"{c['instance_count']} inst, max {c['max_batch_size']}, pref {c['preferred_batch_sizes']}, "
                  f"delay {c['max_queue_delay_us']} µs",
                  "dominated" if p["dominated"] else ("front" if p["top1"] is not None else "no accuracy report"))
    return t


def tune_document(jobs: list[ModelTune], meta: dict[str, Any], workdir: Path = Path("build")) -> dict[str, Any]:
    """``tune.json``: settings, and per model baseline/best/trials (top level too for one model)."""
    doc: dict[str, Any] = dict(meta)
    doc["models"] = {job.model: summary(job) for job in jobs}
    if len(jobs) == 1:
        doc.update({k: doc["models"][jobs[0].model][k] for k in ("baseline", "best", "trials")})
    if len(jobs) > 1:
        doc["pareto"] = pareto(jobs, workdir)
    return doc


def write_reports(jobs: list[ModelTune], meta: dict[str, Any], directory: Path, workdir: Path = Path("build")) -> list[Path]:
    """Write tune.json, trials.csv and the plots into ``directory``; return the files."""
    directory.mkdir(parents=True, exist_ok=True)
    doc = tune_document(jobs, meta, workdir)
    written = [_write_text(directory / "tune.json", json.dumps(doc, indent=2) + "\n"), _write_csv(directory / "trials.csv", jobs)]
    written.append(_plot_trials(jobs, meta["slo_p99_ms"], directory / "throughput_vs_p99.png"))
    if len(jobs) > 1:
        written.append(_plot_pareto(doc["pareto"], meta["slo_p99_ms"], directory / "pareto.png"))
    return written


def _write_text(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def _write_csv(path: Path, jobs: list[ModelTune]) -> Path:
    fields = ["model", "trial", "published", "instance_count", "max_batch_size", "preferred_batch_sizes", "max_queue_delay_us",
              "infer_per_s", "p99_ms", "load", "meets_slo", "fixed_load_p99_ms", "gpu_model_mib", "gpu_mib_per_instance",
              "error", "cached", "seconds"]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for job in jobs:
            for i, trial in enumerate(job.trials, 1):
                d = trial.to_dict()
                writer.writerow({"model": job.model, "trial": i, "published": trial.baseline, **d["config"],
                                 "preferred_batch_sizes": " ".join(map(str, d["config"]["preferred_batch_sizes"])),
                                 "infer_per_s": d["infer_per_s"], "p99_ms": d["p99_ms"],
                                 "load": next(iter(d["load"].values())) if d["load"] else None, "meets_slo": d["meets_slo"],
                                 "fixed_load_p99_ms": d["fixed_load"]["p99_ms"] if d["fixed_load"] else None,
                                 **_memory_fields(trial),
                                 "error": d["error"], "cached": d["cached"], "seconds": d["seconds"]})
    tmp.replace(path)
    return path


def _memory_fields(trial: Trial) -> dict[str, float | None]:
    """The CSV's GPU memory columns (empty when not measured)."""
    m = trial.gpu_memory
    return {"gpu_model_mib": round(m.model_bytes / MIB, 1) if m else None,
            "gpu_mib_per_instance": round(m.per_instance_bytes / MIB, 1) if m else None}


def _plot_trials(jobs: list[ModelTune], slo: float, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(jobs), figsize=(6.5 * len(jobs), 4.6), squeeze=False)
    for ax, job in zip(axes[0], jobs):
        best = job.best
        for trial in job.trials:
            points = sorted((p for p in trial.points if p["p99_ms"] is not None), key=lambda p: p["load"])
            if not points:
                continue
            style = {"color": "tab:green", "lw": 2.2, "label": f"best: {trial.candidate.label}"} if trial is best else (
                {"color": "black", "lw": 1.6, "ls": "--", "label": f"published: {trial.candidate.label}"} if trial.baseline
                else {"color": "tab:gray", "lw": 0.8, "alpha": 0.6})
            ax.plot([p["infer_per_s"] for p in points], [p["p99_ms"] for p in points], marker="o", ms=3, **style)
        ax.axhline(slo, color="tab:red", lw=1, ls=":", label=f"SLO p99 {slo:g} ms")
        ax.set(title=job.model, xlabel="throughput (infer/s)", ylabel="client p99 (ms)", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Each candidate's load ramp: p99 vs throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_pareto(points: list[dict[str, Any]], slo: float, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.6))
    for p in points:
        if p["top1"] is None:
            continue
        ax.scatter(p["infer_per_s"], p["top1"] * 100, marker="x" if p["dominated"] else "o", s=60,
                   color="tab:gray" if p["dominated"] else "tab:blue")
        ax.annotate(p["model"] + (" (dominated)" if p["dominated"] else ""), (p["infer_per_s"], p["top1"] * 100),
                    fontsize=8, textcoords="offset points", xytext=(4, 4))
    front = sorted((p for p in points if p["top1"] is not None and not p["dominated"]), key=lambda p: p["infer_per_s"])
    if front:
        ax.plot([p["infer_per_s"] for p in front], [p["top1"] * 100 for p in front], color="tab:blue", lw=1)
    ax.set(title=f"Accuracy vs throughput under p99 ≤ {slo:g} ms", xlabel="best infer/s under the SLO", ylabel=f"{accuracy_name(points)} (%)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
