"""One self-contained HTML page of everything the pipeline measured.

``index.html`` gathers the builds under the workdir (``<workdir>/<name>/manifest.json``: the variants
with accuracy, size and latency and their chart (:mod:`pipeline.reports.variants`, written beside the page
as ``build-<name>-variants.png`` too), the Triton models published, stages and times, ``parity.json``,
``accuracy.json``, ``served.json``), ``verify``'s ``<workdir>/verify.json``, the
newest load test under the reports directory (``<reports>/<timestamp>/results.json`` and its plots,
or ``<reports>/results.json`` when it is one run's folder), the newest MLPerf scenario run (``mlperf.json``,
and ``mlperf_accuracy.json`` in accuracy mode) and the newest tune run
(``<reports>/tune-<timestamp>/tune.json``, ``trials.csv`` and its plots, rendered generically).
Images are embedded as ``data:`` URIs and the styles are inline: the page fetches nothing, so it
can be mailed, archived as a CI artifact, or opened offline.
"""

from __future__ import annotations

import base64
import csv
import datetime as _dt
import html
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.atomic import write_text_atomic
from pipeline.core.errors import PipelineError
from pipeline.core.tables import TableData
from pipeline.reports.build_tables import accuracy_data, served_data, stage_data, stage_total, tensorrt_data
from pipeline.reports.variants import published_data, variant_notes, variant_rows, variants_data

log = logging.getLogger(__name__)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_ROWS = 500  # a CSV or JSON list longer than this is cut, with a line saying so

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1400px;padding:0 1em;color:#1b1f23;background:#fff}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #d0d7de;padding-bottom:.2em;margin-top:2em}h3{margin-top:1.4em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-variant-numeric:tabular-nums}caption{caption-side:bottom;text-align:left;color:#57606a;font-size:.9em;padding-top:.3em}
th,td{border:1px solid #d0d7de;padding:.25em .6em;vertical-align:top}td:nth-child(-n+2){white-space:nowrap}th{background:#f6f8fa;text-align:left}td.num{text-align:right;white-space:nowrap}
tr.best td{background:#dafbe1;font-weight:600}tr.bad td{background:#ffebe9}tr.dim td{color:#57606a}
.pass{color:#1a7f37;font-weight:600}.FAIL{color:#cf222e;font-weight:600}.undecided{color:#9a6700;font-weight:600}
.meta{color:#57606a}.note{color:#57606a;margin:.2em 0;font-size:.95em}code{background:#f6f8fa;padding:.1em .3em;border-radius:3px}img{max-width:100%;border:1px solid #d0d7de;margin:.5em 0}
nav a{margin-right:1em}details{margin:.5em 0}
"""


@dataclass
class Section:
    """One part of the page: an anchor, a heading, and its HTML body."""

    anchor: str
    title: str
    body: list[str] = field(default_factory=list)


def write_html_report(workdir: Path, reports: Path, output: Path | None = None) -> Path:
    """Write ``output`` (default ``<reports>/index.html``) from what ``workdir`` and ``reports`` hold;
    raise PipelineError (nothing written) when neither holds anything to report."""
    workdir, reports = Path(workdir), Path(reports)
    output = Path(output) if output else reports / "index.html"
    sections = (build_sections(workdir, charts=output.parent) + verify_sections(workdir) + loadtest_sections(reports) + mlperf_sections(reports)
                + tune_sections(reports))
    if not sections:
        raise PipelineError(
            f"nothing to report: no build manifest ({workdir}/<name>/manifest.json) and no load-test or tune results "
            f"({reports}/<timestamp>/results.json or mlperf.json, {reports}/tune-<timestamp>/tune.json)",
            "run `python -m pipeline build` or `loadtest` first, or point --workdir/--reports at their outputs",
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    page = write_text_atomic(output, render_page(sections, sources=[workdir, reports]))
    page.chmod(0o644)  # a page to share, not a private temporary
    return page


def refresh_html_report(workdir: Path, reports: Path) -> Path | None:
    """Rewrite ``<reports>/index.html`` after a command; a problem is logged, never fatal to the command."""
    try:
        return write_html_report(workdir, reports)
    except (PipelineError, OSError) as exc:
        log.warning("HTML report not written: %s", exc)
        return None


def render_page(sections: list[Section], sources: list[Path]) -> str:
    """The whole page: title, table of contents, sections."""
    when = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    nav = " ".join(f'<a href="#{s.anchor}">{_e(s.title)}</a>' for s in sections)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">',
        "<title>keras-trt-pipeline report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>keras-trt-pipeline report</h1>",
        f'<p class="meta">generated {_e(when)} from {", ".join(f"<code>{_e(str(p))}</code>" for p in sources)}</p>',
        f"<nav>{nav}</nav>",
    ]
    for s in sections:
        parts.append(f'<section id="{s.anchor}"><h2>{_e(s.title)}</h2>')
        parts.extend(s.body)
        parts.append("</section>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


# -- builds --------------------------------------------------------------------------------------


def build_sections(workdir: Path, charts: Path | None = None) -> list[Section]:
    """One section per ``<workdir>/<name>/manifest.json``, newest first; each build's variants chart is
    written to ``<charts>/build-<name>-variants.png`` (None: not written) and embedded."""
    manifests = sorted(workdir.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime, reverse=True) if workdir.is_dir() else []
    sections = []
    for path in manifests:
        manifest = _read_json(path)
        if not isinstance(manifest, dict) or "stages" not in manifest:
            continue
        name = path.parent.name
        section = Section(f"build-{_slug(name)}", f"build '{name}'")
        section.body.append(f'<p class="meta">command <code>{_e(manifest.get("command", ""))}</code> · manifest '
                            f"<code>{_e(str(path))}</code> · {_e(stage_total(manifest))}</p>")  # fmt: skip
        results: dict[str, Any] = manifest["results"] if isinstance(manifest.get("results"), dict) else {}
        section.body.extend(_variants_html(path.parent, manifest, results, charts))
        section.body.append(table_html(stage_data(manifest, "stages")))
        parity = _read_json(path.parent / "parity.json")
        if isinstance(parity, dict) and parity.get("outputs"):
            section.body.append(table_html(_parity_data(parity)))
        checked = tensorrt_data(results)
        if checked is not None:
            section.body.append(table_html(checked))
        accuracy = results.get("accuracy") or _read_json(path.parent / "accuracy.json")
        if isinstance(accuracy, dict) and accuracy.get("variants"):
            section.body.append(table_html(accuracy_data(accuracy)))
        served = results.get("served") or _read_json(path.parent / "served.json")
        if isinstance(served, dict) and served.get("models"):
            section.body.append(table_html(served_data(served["models"])))
            for model, why in (served.get("skipped") or {}).items():
                section.body.append(f'<p class="meta">served check skipped {_e(model)}: {_e(why)}</p>')
        if manifest.get("artifacts"):
            section.body.append(table_html(_mapping_data("artifacts", manifest["artifacts"])))
        if manifest.get("versions"):
            section.body.append("<details><summary>tool versions</summary>"
                                + table_html(_mapping_data("", manifest["versions"])) + "</details>")  # fmt: skip
        sections.append(section)
    return sections


def _variants_html(build_dir: Path, manifest: dict[str, Any], results: dict[str, Any], charts: Path | None) -> list[str]:
    """The variants table (accuracy, size, latency), what an unusual variant is, the chart, and what was published."""
    rows = variant_rows(manifest, build_dir)
    out = []
    if rows:
        latency = results.get("latency") or _read_json(build_dir / "latency.json")
        out.append(table_html(variants_data(rows, latency if isinstance(latency, dict) else None)))
    out.extend(f'<p class="note">{_e(line)}</p>' for line in variant_notes(rows, results))
    if rows and charts is not None:
        from pipeline.reports.variant_chart import variant_chart_png

        try:
            png = variant_chart_png(rows, charts / f"build-{_slug(build_dir.name)}-variants.png", f"build '{build_dir.name}': variants")
        except (OSError, ValueError) as exc:
            log.warning("variants chart of %s not written: %s", build_dir.name, exc)
            png = None
        if png is not None:
            out.extend(_figures([png]))
    published = published_data(build_dir, manifest)
    if published is not None:
        out.append(table_html(published))
    return out


def _parity_data(parity: dict[str, Any]) -> TableData:
    tol = parity.get("tolerance", {})
    table = TableData(f"parity: {parity.get('candidate', 'ONNX')} vs {parity.get('reference', 'TensorFlow')} on {parity.get('samples', '?')} samples "
                      f"(atol {tol.get('atol', '?')}, rtol {tol.get('rtol', '?')})", ["output", "max abs", "max rel", "check"])  # fmt: skip
    for output, stats in parity["outputs"].items():
        table.add([output, _fmt(stats.get("max_abs")), _fmt(stats.get("max_rel")), "pass" if parity.get("passed") else "FAIL"])
    return table


def verify_sections(workdir: Path) -> list[Section]:
    """``<workdir>/verify.json`` (what ``verify`` wrote): served vs in-process accuracy per model."""
    path = workdir / "verify.json"
    report = _read_json(path)
    if not isinstance(report, dict) or not report.get("models"):
        return []
    section = Section("verify", "served verification (verify)")
    section.body.append(f'<p class="meta">repository <code>{_e(str(report.get("repository", "")))}</code> through '
                        f'{_e(str(report.get("url", "")))} · {_e(str(report.get("time", "")))} · <code>{_e(str(path))}</code></p>')
    section.body.append(table_html(served_data(report["models"])))
    for model, why in (report.get("skipped") or {}).items():
        section.body.append(f'<p class="meta">skipped {_e(model)}: {_e(why)}</p>')
    return [section]


# -- load tests ----------------------------------------------------------------------------------


def _runs(reports: Path, marker: str, prefix: str = "") -> list[Path]:
    if not reports.is_dir():
        return []
    found = [p.parent for p in reports.glob(f"{prefix}*/{marker}")]
    if (reports / marker).is_file():  # --reports may name one run's directory
        found.append(reports)
    return sorted(set(found), key=lambda d: (d / marker).stat().st_mtime, reverse=True)


def loadtest_sections(reports: Path) -> list[Section]:
    """The newest load test under ``reports``: settings, the points and metrics tables, the plots."""
    from pipeline.loadtest.report import metrics_data, points_data
    from pipeline.loadtest.results import run_from_dict

    runs = [d for d in _runs(reports, "results.json") if not d.name.startswith("tune-")]
    for run_dir in runs:
        payload = _read_json(run_dir / "results.json")
        if not isinstance(payload, dict) or "points" not in payload:
            continue
        result = run_from_dict(payload)
        slo = (payload.get("slo") or {}).get("p99_ms")
        section = Section("loadtest", f"load test {run_dir.name}")
        server = payload.get("server", {})
        section.body.append(f'<p class="meta">{_e(str(server.get("name") or "Triton"))} {_e(str(server.get("version") or ""))} at '
                            f'{_e(", ".join(server.get("endpoints", [])))} · started {_e(payload.get("started", ""))} · '
                            f"<code>{_e(str(run_dir))}</code>"
                            + (f" · {len(runs) - 1} older run(s) not shown" if len(runs) > 1 else "") + "</p>")  # fmt: skip
        if payload.get("slo"):
            best = payload["slo"].get("best_point")
            verdict = (f'<span class="pass">met</span>: best point {_e(best["model"])} {_e(best["load"])}, {best["infer_per_s"]:,.1f} infer/s '
                       f'at p99 {best["p99_ms"]:.3f} ms') if best else '<span class="FAIL">no point meets it</span>'  # fmt: skip
            section.body.append(f"<p>SLO p99 ≤ {slo:g} ms: {verdict}</p>")
        for failure in result.failures:
            section.body.append(f'<p class="FAIL">failed: {_e(failure)}</p>')
        for model, why in result.skipped_models.items():
            section.body.append(f'<p class="meta">skipped {_e(model)}: {_e(why)}</p>')
        section.body.append(table_html(points_data(result, slo)))
        section.body.append(table_html(metrics_data(result)))
        section.body.append(table_html(_mapping_data("settings", payload.get("settings", {}))))
        section.body.extend(_images(run_dir))
        return [section]
    return []


def mlperf_sections(reports: Path) -> list[Section]:
    """The newest ``loadtest --scenario`` run (``<reports>/<timestamp>/mlperf.json``): each run's verdict, and in
    accuracy mode the served judgement of its logged answers (``mlperf_accuracy.json``)."""
    from pipeline.loadtest.loadgen.report import mlperf_data

    runs = [d for d in _runs(reports, "mlperf.json") if not d.name.startswith("tune-")]
    payload = _read_json(runs[0] / "mlperf.json") if runs else None
    if not isinstance(payload, dict) or not payload.get("runs"):
        return []
    run_dir = runs[0]
    section = Section("mlperf", f"MLPerf scenarios {run_dir.name}")
    section.body.append(f"<p class=\"meta\">MLPerf's LoadGen; its four logs per model in <code>{_e(str(run_dir / 'mlperf'))}</code>"
                        + (f" · {len(runs) - 1} older run(s) not shown" if len(runs) > 1 else "") + "</p>")
    section.body.append(table_html(mlperf_data(payload["runs"])))
    judged = _read_json(run_dir / "mlperf_accuracy.json")
    if isinstance(judged, dict) and judged.get("models"):
        section.body.append(table_html(served_data(judged["models"] + [{"model": n, "not_verified": why}
                                                                        for n, why in sorted((judged.get("not_verified") or {}).items())])))
    return [section]


# -- tune (rendered generically: its files are another module's) ----------------------------------


def tune_sections(reports: Path) -> list[Section]:
    """The newest ``tune-<ts>/``: tune.json as tables, trials.csv, every PNG."""
    runs = _runs(reports, "tune.json", "tune-")
    if not runs:
        return []
    run_dir = runs[0]
    section = Section("tune", f"tune {run_dir.name.removeprefix('tune-')}")
    section.body.append(f'<p class="meta"><code>{_e(str(run_dir))}</code>' + (f" · {len(runs) - 1} older run(s) not shown" if len(runs) > 1 else "") + "</p>")
    doc = _read_json(run_dir / "tune.json")
    trials_csv = run_dir / "trials.csv"
    if isinstance(doc, dict):
        section.body.extend(json_html(doc, "tune.json", skip={"trials"} if trials_csv.is_file() else set()))
    if trials_csv.is_file():
        section.body.append(table_html(_csv_data(trials_csv)))
    section.body.extend(_images(run_dir))
    return [section]


def json_html(value: dict[str, Any], title: str, depth: int = 0, skip: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """A JSON object as HTML: its scalars as one table, lists of objects as tables, objects as subsections."""
    out: list[str] = []
    scalars = {k: v for k, v in value.items() if not isinstance(v, (dict, list)) and k not in skip}
    small = {k: v for k, v in value.items() if isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v) and k not in skip}
    if scalars or small:
        out.append(table_html(_mapping_data(title, {**scalars, **{k: ", ".join(map(str, v)) for k, v in small.items()}})))
    for key, item in value.items():
        if key in skip or key in scalars or key in small:
            continue
        if isinstance(item, list) and item and all(isinstance(x, dict) for x in item):
            out.append(table_html(_records_data(f"{title} › {key}", item)))
        elif isinstance(item, dict) and depth < 3:
            out.append(f"<h{min(3 + depth, 6)}>{_e(key)}</h{min(3 + depth, 6)}>")
            out.extend(json_html(item, key, depth + 1, skip))
        elif isinstance(item, (dict, list)):
            out.append(f"<details><summary>{_e(key)}</summary><pre>{_e(json.dumps(item, indent=1)[:20000])}</pre></details>")
    return out


def _records_data(title: str, records: list[dict[str, Any]]) -> TableData:
    columns = list(dict.fromkeys(k for r in records for k in r))
    table = TableData(title, columns, left=len(columns))
    for r in records[:MAX_ROWS]:
        table.add([_cell(r.get(c)) for c in columns], "dim" if r.get("dominated") is True else "")
    if len(records) > MAX_ROWS:
        table.caption = f"first {MAX_ROWS} of {len(records)} rows"
    return table


def _csv_data(path: Path) -> TableData:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    table = TableData(path.name, rows[0] if rows else [], left=len(rows[0]) if rows else 0)
    for row in rows[1 : MAX_ROWS + 1]:
        table.add(row)
    if len(rows) - 1 > MAX_ROWS:
        table.caption = f"first {MAX_ROWS} of {len(rows) - 1} rows"
    return table


# -- HTML pieces -----------------------------------------------------------------------------------


def table_html(table: TableData) -> str:
    """A TableData as an HTML table; verdict cells get their class, numbers are right-aligned."""
    head = "".join(f"<th>{_e(c)}</th>" for c in table.columns)
    body = []
    for cells, style in zip(table.rows, table.styles):
        tds = []
        for i, cell in enumerate(cells):
            cls = [cell] if cell in ("pass", "FAIL", "undecided") else []
            cls += ["num"] if table.right_aligned(i) else []
            tds.append(f'<td class="{" ".join(cls)}">{_e(cell)}</td>' if cls else f"<td>{_e(cell)}</td>")
        body.append(f'<tr class="{style}">' if style else "<tr>")
        body.append("".join(tds) + "</tr>")
    caption = f"<caption>{_e(table.caption)}</caption>" if table.caption else ""
    title = f"<h3>{_e(table.title)}</h3>" if table.title else ""
    return f"{title}<table>{caption}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _images(directory: Path) -> list[str]:
    """Every PNG in ``directory``, embedded as a data: URI."""
    return _figures(sorted(p for p in directory.glob("*.png") if not is_variants_chart(p)))


def is_variants_chart(path: Path) -> bool:
    """Whether ``path`` is a build's variants chart written beside the page (not a load test's or tune run's plot)."""
    return path.name.startswith("build-") and path.name.endswith("-variants.png")


def _figures(pngs: list[Path]) -> list[str]:
    """Each PNG embedded as a data: URI, captioned with its file name."""
    out = []
    for png in pngs:
        data = png.read_bytes()
        if not data.startswith(PNG_MAGIC):
            log.warning("not embedding %s: not a PNG file", png)
            continue
        uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        out.append(f'<figure><img src="{uri}" alt="{_e(png.stem)}"><figcaption class="meta">{_e(png.name)}</figcaption></figure>')
    return out


def _mapping_data(title: str, mapping: dict[str, Any]) -> TableData:
    table = TableData(title, ["key", "value"], left=2)
    for key, value in mapping.items():
        table.add([str(key), _cell(value)])
    return table


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return _fmt(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def _fmt(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "—" if value is None else str(value)
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)
