"""One row per variant of a build, for judging it at a glance: accuracy, its gate, file size and
latency (from the manifest's ``accuracy`` and ``latency`` results), and the Triton models published.

Drawn on the terminal by :mod:`pipeline.reports.terminal` and in the page by :mod:`pipeline.reports.html`; the
chart of the same rows is :mod:`pipeline.reports.variant_chart`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.tables import TableData
from pipeline.reports.build_tables import figure_text, limit_text
from pipeline.core.onnx_files import total_size

# What a variant is, in one line, where the name alone does not say it.
VARIANT_NOTES = {
    "int8": "int8: INT8 Q/DQ for TensorRT; ONNX Runtime serves it on a CPU with graph optimizations off (exact Q/DQ, as TensorRT "
            "computes), so its CPU latency says nothing of its speed as a TensorRT engine",
    "int8cpu": "int8cpu: INT8 for CPU serving, run by ONNX Runtime's CPU integer kernels (uint8 activations, int8 weights); "
               "added with --int8 unless --no-int8-cpu, and left out when its gate does not pass",
    "u8": "u8: the FP32 model taking uint8 inputs (clients send bytes; it computes as FP32 does)",
}


@dataclass
class VariantRow:
    """One variant: its accuracy (plain, with labels) or agreement with FP32, gate, size and latency per target and batch."""

    variant: str  # "fp16-onnx"
    precision: str
    kind: str
    accuracy: float | None = None  # plain accuracy of the primary output (labels), 0..1
    accuracy_metric: str | None = None  # what that accuracy is: "top-1", "R²", "mIoU" (stages/accuracy.py)
    agreement: float | None = None  # top-1 agreement with FP32 (no labels), 0..1
    metric: str = ""  # the gate's first figure's name, e.g. "accuracy drop (top-1)"
    figure: str = ""  # its value with bounds, unit and limit, e.g. "0.00 [-0.60, 0.60] pt (≤ 1 pt)"
    gate: str = ""  # "pass" | "FAIL" | "undecided" | "reference"
    bytes: int | None = None
    latency: dict[tuple[str, int], float] = field(default_factory=dict)  # (target "cpu"/"gpu", batch) → median ms


def variant_rows(manifest: dict[str, Any], build_dir: Path | None = None) -> list[VariantRow]:
    """The variants of a build's manifest, in the order it made them (artifacts, then any only the reports name)."""
    results = manifest.get("results") or {}
    accuracy = _dict(results.get("accuracy")) or (_read(build_dir / "accuracy.json") if build_dir else {})
    latency = _dict(results.get("latency")) or (_read(build_dir / "latency.json") if build_dir else {})
    rows: dict[str, VariantRow] = {}
    for key, path in (manifest.get("artifacts") or {}).items():
        precision, _, kind = str(key).partition(".")
        row = rows.setdefault(f"{precision}-{kind}", VariantRow(f"{precision}-{kind}", precision, kind))
        row.bytes = _size(Path(path))
    for measured in latency.get("variants") or []:
        row = rows.setdefault(measured["variant"], VariantRow(measured["variant"], measured.get("precision", ""), measured.get("kind", "")))
        row.bytes = measured.get("bytes", row.bytes)
        for point in measured.get("batches") or []:
            row.latency[(measured.get("target", "cpu"), int(point["batch"]))] = float(point["median_ms"])
    variants = accuracy.get("variants") or []
    reference = next((v.get("reference_accuracy") for v in variants if v.get("reference_accuracy") is not None), None)
    if "fp32-onnx" in rows and variants:
        rows["fp32-onnx"].accuracy, rows["fp32-onnx"].gate = reference, "reference"
        rows["fp32-onnx"].accuracy_metric = next((v.get("accuracy_metric") for v in variants if v.get("reference_accuracy") is not None), None)
        rows["fp32-onnx"].agreement = 1.0 if reference is None else None
    for judged in variants:
        row = rows.setdefault(judged["variant"], VariantRow(judged["variant"], judged.get("precision", ""), judged.get("kind", "")))
        row.accuracy, row.agreement, row.accuracy_metric = judged.get("accuracy"), judged.get("agreement"), judged.get("accuracy_metric")
        row.gate = "pass" if judged.get("passed") else ("undecided" if judged.get("undecided") else "FAIL")
        first = next((g for g in judged.get("gates") or [] if g.get("value") is not None), None)
        if first:
            row.metric, row.figure = str(first["metric"]), f"{figure_text(first)} ({limit_text(first)})"
    return list(rows.values())


def latency_points(rows: list[VariantRow]) -> list[tuple[str, int]]:
    """The (target, batch) columns measured for any row: CPU first, batch 1 first."""
    return sorted({p for r in rows for p in r.latency}, key=lambda p: (p[0] != "cpu", p[0], p[1]))


def variants_data(rows: list[VariantRow], latency: dict[str, Any] | None = None, figures: bool = True) -> TableData:
    """The variants table: accuracy, the gate's figure (``figures``; the terminal leaves it to the accuracy
    table above it), size, and median latency per target and batch."""
    points = latency_points(rows)
    plain = any(r.accuracy is not None for r in rows)
    metrics = {r.metric for r in rows if r.figure}
    common = next(iter(metrics)) if len(metrics) == 1 else ""  # named once in the header when every variant's is the same
    column = f"{common} vs FP32 (limit)" if common else "gate figure vs FP32 (limit)"
    named = {r.accuracy_metric for r in rows if r.accuracy is not None}
    heading = f"accuracy ({next(iter(named))})" if len(named) == 1 and None not in named else "accuracy"
    columns = ["variant", heading if plain else "agreement with FP32", *([column] if figures else []), "gate", "size"]
    columns += [f"{target.upper()} ms, batch {batch}" for target, batch in points]
    table = TableData("variants: accuracy, size, latency", columns, align="lr" + ("l" if figures else "") + "lr" + "r" * len(points))
    for r in rows:
        value = r.accuracy if plain else r.agreement
        shown = (r.figure if common else f"{r.metric}: {r.figure}") if r.figure else ("reference" if r.gate == "reference" else "—")
        figure = [shown] if figures else []
        table.add([r.variant, "—" if value is None else f"{value:.2%}", *figure, ("" if figures else "reference") if r.gate == "reference" else r.gate,
                   size_text(r.bytes)] + [_ms(r.latency.get(p)) for p in points], "bad" if r.gate == "FAIL" else "")  # fmt: skip
    table.caption = latency_caption(latency or {})
    return table


def latency_caption(latency: dict[str, Any]) -> str:
    """Where and how the latency was measured."""
    if not latency.get("variants"):
        return "latency not measured for this build"
    targets = {v.get("target") for v in latency["variants"]}
    calls = sorted({int(b["calls"]) for v in latency["variants"] for b in v.get("batches") or [] if isinstance(b.get("calls"), int)})
    count = f"{calls[0]}–{calls[-1]}" if len(calls) > 1 else str(calls[0] if calls else latency.get("repeats", "?"))
    parts = [f"latency: {latency.get('statistic', 'median')} of {count} in-process calls after {latency.get('warmup', '?')} warm-up calls "
             f"(fewer for a slow model), measured {str(latency.get('measured_at', ''))[:16].replace('T', ' ')}"]
    if "cpu" in targets:
        parts.append(f"CPU: {latency.get('cpu', '?')}, {latency.get('threads', '?')} threads, ONNX Runtime as each variant is served")
    gpus = sorted({str(v.get("device")) for v in latency["variants"] if v.get("target") == "gpu"})
    if gpus:
        parts.append(f"GPU: {', '.join(gpus)}, TensorRT plans")
    return "; ".join(parts)


def variant_notes(rows: list[VariantRow], results: dict[str, Any]) -> list[str]:
    """One line per variant kind that needs saying (CPU INT8, uint8 input), and one per variant left out."""
    present = {r.precision for r in rows}
    notes = [line for precision, line in VARIANT_NOTES.items() if precision in present]
    fallback = results.get("int8_fallback") if isinstance(results, dict) else None
    for record in (fallback.values() if isinstance(fallback, dict) else []):
        if isinstance(record, dict) and record.get("needed") and record.get("line"):
            notes.append(f"INT8 fallback: {record['line']}")
    left_out = results.get("left_out") if isinstance(results, dict) else None
    for item in left_out if isinstance(left_out, list) else []:
        if isinstance(item, dict):
            notes.append(f"left out: {item.get('variant', '?')}: {item.get('reason', 'no reason recorded')}")
        else:
            notes.append(f"left out: {item}")
    return notes


def published_data(build_dir: Path, manifest: dict[str, Any]) -> TableData | None:
    """The Triton models this build published: name, the versions in the repository, this build's new ones, where."""
    new = [Path(p) for p in _list(_read_any(build_dir / "published.json"))]
    repository = new[0].parent.parent if new else _repository(build_dir)  # the version folders name it as the build saw it
    if repository is None:
        return None
    name = build_dir.name
    models = []
    for key in manifest.get("artifacts") or {}:
        precision, _, kind = str(key).partition(".")
        models.append(f"{name}_{precision}" + ("_trt" if kind == "plan" else ""))
    table = TableData(f"published to the Triton repository {repository}", ["Triton model", "versions", "this build's version", "path"], left=4)
    for model in models:
        folder = repository / model
        versions = sorted((int(p.name) for p in folder.iterdir() if p.name.isdigit()), reverse=False) if folder.is_dir() else []
        added = [p.name for p in new if p.parent.name == model]
        table.add([model, ", ".join(map(str, versions)) or "none", ", ".join(added) or "—", str(folder)])
    return table


def size_text(size: int | None) -> str:
    """Bytes as ``117 KB`` / ``4.2 MB`` (decimal units, as file managers show them)."""
    if size is None:
        return "—"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} B"


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _repository(build_dir: Path) -> Path | None:
    sidecar = _read(build_dir / "published.json.stage.json")
    repository = ((sidecar.get("settings") or {}).get("settings") or {}).get("repository") if sidecar else None
    return Path(repository) if repository else None


def _size(path: Path) -> int | None:
    try:
        return total_size(path) if path.is_file() else None  # an ONNX model with its data file
    except OSError:
        return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _read_any(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read(path: Path) -> dict[str, Any]:
    return _dict(_read_any(path))
