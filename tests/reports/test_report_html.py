"""`python -m pipeline report`: one self-contained page, checked in a real headless Chromium.

The page is rendered (screenshot not blank), its tables and images are in the DOM, and it makes
no network request: the HTML names no remote URL, and Chromium's network log (with every host
name made unresolvable, so nothing could leave the machine anyway) shows no request from the page.
A control page with two remote references proves the network check sees such requests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.conftest import ROOT, Built, cli, one_line_error

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "chromium is not installed (scripts/setup.sh installs it: apt-get install chromium)"


def without_chromium(ci: str | None) -> str:
    """What the browser tests do where Chromium is missing: skip on a developer's machine, fail in CI
    (``CI=true``, where scripts/setup.sh installed it), so CI cannot pass without running them."""
    return "fail" if (ci or "").strip().lower() in ("true", "1") else "skip"


@pytest.fixture
def chromium_installed() -> None:
    if CHROMIUM is None:
        if without_chromium(os.environ.get("CI")) == "fail":
            pytest.fail(f"{NO_CHROMIUM}; CI must run the page test")
        pytest.skip(NO_CHROMIUM)


needs_chromium = pytest.mark.usefixtures("chromium_installed")


@pytest.mark.parametrize(("ci", "expected"), [("true", "fail"), ("TRUE", "fail"), ("1", "fail"), (None, "skip"), ("", "skip"), ("false", "skip")])
def test_a_missing_chromium_fails_in_ci_and_skips_elsewhere(ci: str | None, expected: str) -> None:
    assert without_chromium(ci) == expected
FAST = ["--window-ms", "300", "--warmup-ms", "200", "--max-seconds", "2", "--timeout-ms", "2000"]


def chromium(page: Path, work: Path, *mode: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run headless Chromium on ``page`` with every host name unresolvable and a network log; return it and the log."""
    assert CHROMIUM is not None
    netlog = work / f"netlog-{len(list(work.glob('netlog-*')))}.json"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", f"--user-data-dir={work / 'profile'}",
         "--host-resolver-rules=MAP * ~NOTFOUND", f"--log-net-log={netlog}", *mode, page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, netlog


def page_requests(netlog: Path) -> list[str]:
    """URLs the page (not the browser itself: its updater has no initiator origin) asked the network for."""
    log = json.loads(netlog.read_text())
    kinds = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    urls: dict[int, str] = {}
    from_page: set[int] = set()
    for event in log["events"]:
        params, source = event.get("params", {}), event["source"]["id"]
        if kinds[event["type"]] == "REQUEST_ALIVE" and "url" in params:
            urls[source] = params["url"]
        if kinds[event["type"]] == "URL_REQUEST_START_JOB" and params.get("initiator", "not an origin") != "not an origin":
            from_page.add(source)
    return sorted(urls[s] for s in from_page if s in urls and not urls[s].startswith(("file:", "data:")))


class Dom(HTMLParser):
    """Sections (by id) with their table headers and image sources."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, dict[str, list]] = {}
        self.current: dict[str, list] | None = None
        self.in_th = False
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "section":
            self.current = self.sections.setdefault(a["id"] or "", {"headers": [], "images": [], "cells": []})
        elif self.current is not None and tag == "table":
            self.current["headers"].append([])
        elif self.current is not None and tag == "img":
            self.current["images"].append(a.get("src") or "")
        self.in_th = tag == "th"

    def handle_data(self, data: str) -> None:
        if self.current is None:
            return
        if self.in_th:
            self.current["headers"][-1].append(data.strip())
        elif self.tags and self.tags[-1] == "td":
            self.current["cells"].append(data.strip())

    def handle_endtag(self, tag: str) -> None:
        self.in_th = False
        if tag == "section":
            self.current = None


def test_nothing_to_report_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "reports" / "20250101-000000").mkdir(parents=True)  # a run directory without results
    line = one_line_error(cli("report", "--workdir", str(tmp_path / "build"), "--reports", str(tmp_path / "reports")))
    assert line.startswith("error: nothing to report: no build manifest") and "python -m pipeline build" in line
    assert not (tmp_path / "reports" / "index.html").exists() and not (tmp_path / "build").exists()


@needs_chromium
def test_the_network_check_sees_a_page_that_fetches(tmp_path: Path) -> None:
    control = tmp_path / "control.html"
    control.write_text('<html><body><img src="http://example.invalid/x.png"><link rel="stylesheet" href="https://cdn.example.invalid/a.css"></body></html>')
    _, netlog = chromium(control, tmp_path, "--dump-dom")
    assert page_requests(netlog) == ["http://example.invalid/x.png", "https://cdn.example.invalid/a.css"]


def _tune_run(directory: Path) -> None:
    """A tune report directory in the layout `tune` writes (tune.json, trials.csv, two PNG plots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True)
    config = {"instance_count": 2, "max_batch_size": 32, "preferred_batch_sizes": [8, 16], "max_queue_delay_us": 200}
    doc = {"slo_p99_ms": 5.0, "policy": "grid", "models": {"digits_fp32": {"best": {"config": config, "infer_per_s": 2500.0}}},
           "pareto": [{"model": "digits_fp32", "top1": 0.9755, "infer_per_s": 2500.0, "config": config, "dominated": False},
                      {"model": "digits_int8", "top1": 0.9733, "infer_per_s": 1500.0, "config": config, "dominated": True}]}  # fmt: skip
    (directory / "tune.json").write_text(json.dumps(doc, indent=2))
    (directory / "trials.csv").write_text("model,trial,instance_count,infer_per_s,p99_ms,meets_slo\n"
                                          "digits_fp32,1,1,1800.5,3.2,True\ndigits_fp32,2,2,2500.0,4.1,True\n")  # fmt: skip
    for name in ("throughput_vs_p99", "pareto"):
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.plot([1, 2, 3], [3, 1, 2], marker="o")
        ax.set_title(name)
        fig.savefig(directory / f"{name}.png", dpi=80)
        plt.close(fig)


@needs_chromium
@pytest.mark.slow
def test_report_after_build_verify_loadtest_and_tune_renders_every_section(built: Built, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    reports = workdir / "reports"  # the default reports folder of the workdir
    (workdir / "digits").mkdir(parents=True)
    for report in (built.workdir / "digits").glob("*.json"):  # the shared build stays untouched
        shutil.copy2(report, workdir / "digits" / report.name)
    verify = cli("verify", "--repository", str(built.repository), "--workdir", str(workdir), cwd=tmp_path)
    assert verify.returncode == 0, verify.stderr[-3000:]
    assert (workdir / "verify.json").is_file() and f"report: {reports / 'index.html'}" in verify.stdout
    loadtest = cli("loadtest", "--repository", str(built.repository), "--model", "digits_fp32", "--concurrency", "1,2", *FAST,
                   "--calibration-root", str(ROOT / "calibration"), "--workdir", str(workdir), cwd=tmp_path)  # fmt: skip
    assert loadtest.returncode == 0, loadtest.stderr[-3000:]
    assert f"report: {reports / 'index.html'}" in loadtest.stdout  # loadtest refreshes the workdir's page and says where
    assert len(list(reports.glob("*/results.json"))) == 1 and list((workdir / "triton").glob("tritonserver-*.log"))
    _tune_run(reports / "tune-20250101-000100")

    proc = cli("report", "--workdir", str(workdir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = reports / "index.html"
    assert proc.stdout.strip() == f"report: {page}"
    text = page.read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", text, re.I)  # no remote URL to fetch
    assert "<script" not in text and "<link" not in text and "@import" not in text and "url(" not in text

    dumped, netlog = chromium(page, tmp_path, "--dump-dom")
    assert page_requests(netlog) == []
    dom = Dom()
    dom.feed(dumped.stdout)
    assert list(dom.sections) == ["build-digits", "verify", "loadtest", "tune"]
    build = dom.sections["build-digits"]
    firsts = [h[0] for h in build["headers"] if h]
    assert {"stage", "output", "variant"} <= set(firsts)  # stages, parity, accuracy
    assert {"savedmodel", "onnx", "parity", "fp16", "int8", "accuracy", "publish"} <= set(build["cells"])
    assert {"digits_fp32", "digits_fp16", "digits_int8"} <= set(dom.sections["verify"]["cells"])  # verify's rows
    load = dom.sections["loadtest"]
    assert any("infer/s" in h for h in load["headers"]) and any("inferences" in h for h in load["headers"])
    assert len(load["images"]) == 2
    tune = dom.sections["tune"]
    assert len(tune["images"]) == 2 and any("meets_slo" in h for h in tune["headers"]) and any("dominated" in h for h in tune["headers"])
    images = build["images"] + load["images"] + tune["images"]
    assert all(src.startswith("data:image/png;base64,") for src in images)

    shot = tmp_path / "shot.png"
    chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,2400")
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    inked = (pixels.min(axis=2) < 200).mean()  # share of pixels that are not (near) white
    colours = len(np.unique(pixels.reshape(-1, 3), axis=0))
    assert inked > 0.02 and colours > 50, (inked, colours)


class Tables(HTMLParser):
    """Every table of the page: the heading above it, its header cells and its rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict[str, Any]] = []
        self.heading = ""
        self.text: list[str] | None = None
        self.row: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append({"title": self.heading, "headers": [], "rows": []})
        elif tag == "tr" and self.tables:
            self.row = []
        elif tag in ("td", "th", "h3"):
            self.text = []

    def handle_data(self, data: str) -> None:
        if self.text is not None:
            self.text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th", "h3") and self.text is not None:
            text, self.text = "".join(self.text).strip(), None
            if tag == "h3":
                self.heading = text
            elif tag == "th":
                self.tables[-1]["headers"].append(text)
            elif self.row is not None:
                self.row.append(text)
        elif tag == "tr" and self.row is not None:
            if self.row:
                self.tables[-1]["rows"].append(self.row)
            self.row = None

    def titled(self, prefix: str) -> dict[str, Any]:
        [table] = [t for t in self.tables if t["title"].startswith(prefix)]
        return table


def _rendered(page: Path, work: Path) -> Tables:
    dumped, netlog = chromium(page, work, "--dump-dom")
    assert page_requests(netlog) == []
    tables = Tables()
    tables.feed(dumped.stdout)
    return tables


@needs_chromium
@pytest.mark.slow
def test_the_build_report_shows_every_variant_and_a_noop_rebuild_keeps_the_stage_times(built: Built, tmp_path: Path) -> None:
    from pipeline.reports.variants import size_text

    workdir, repository = tmp_path / "build", tmp_path / "model_repository"
    shutil.copytree(built.workdir / "digits", workdir / "digits", symlinks=True)  # the shared build stays untouched
    shutil.copytree(built.repository, repository, symlinks=True)
    manifest = json.loads((workdir / "digits" / "manifest.json").read_text())
    accuracy, latency = manifest["results"]["accuracy"], manifest["results"]["latency"]
    proc = cli("report", "--workdir", str(workdir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = workdir / "reports" / "index.html"
    first = _rendered(page, tmp_path)

    variants = first.titled("variants: accuracy, size, latency")
    figure = "accuracy drop (top-1) vs FP32 (limit)"
    assert variants["headers"] == ["variant", "accuracy (top-1)", figure, "gate", "size", "CPU ms, batch 1", "CPU ms, batch 64"]
    shown = {row[0]: dict(zip(variants["headers"], row)) for row in variants["rows"]}
    assert list(shown) == ["fp32-onnx", "fp16-onnx", "int8-onnx", "int8cpu-onnx"]
    plain = {"fp32-onnx": accuracy["variants"][0]["reference_accuracy"]} | {v["variant"]: v["accuracy"] for v in accuracy["variants"]}
    measured = {v["variant"]: {b["batch"]: b["median_ms"] for b in v["batches"]} for v in latency["variants"]}
    for variant, cells in shown.items():
        assert cells["accuracy (top-1)"] == f"{plain[variant]:.2%}"  # FP32's 97.55% too
        assert cells["size"] == size_text(Path(manifest["artifacts"][variant.replace("-", ".")]).stat().st_size)
        assert [cells["CPU ms, batch 1"], cells["CPU ms, batch 64"]] == [f"{measured[variant][b]:.3f}" if measured[variant][b] < 10
                                                                         else f"{measured[variant][b]:.1f}" for b in (1, 64)]
    assert shown["fp32-onnx"][figure] == "reference" and all(shown[v][figure].endswith(" pt (≤ 1 pt)") for v in list(shown)[1:])
    text = page.read_text()
    assert "int8cpu: INT8 for CPU serving, run by ONNX Runtime&#x27;s CPU integer kernels" in text
    assert (workdir / "reports" / "build-digits-variants.png").read_bytes().startswith(b"\x89PNG") and 'src="data:image/png;base64,' in text
    published = first.titled("published to the Triton repository")
    assert [row[:2] for row in published["rows"]] == [[f"digits_{p}", "1"] for p in ("fp32", "fp16", "int8", "int8cpu")]
    before = {row[0]: row for row in first.titled("stages")["rows"]}
    assert before["engine"][1:3] == ["not run", ""]  # no TensorRT here: no seconds
    assert all(before[s["name"]][2] == f"{s['ran_seconds']:.2f}" for s in manifest["stages"] if s["status"] == "ran")

    rebuild = cli("build", "--fp16", "--int8", "--workdir", str(workdir), "--repository", str(repository))
    assert rebuild.returncode == 0, rebuild.stderr[-3000:]
    statuses = {s["name"]: s["status"] for s in json.loads((workdir / "digits" / "manifest.json").read_text())["stages"]}
    # Every stage is skipped but publish, which re-runs because its repository (part of its settings) is this copy.
    assert {name for name, status in statuses.items() if status == "ran"} == {"publish"}, statuses
    after = {row[0]: row for row in _rendered(page, tmp_path).titled("stages")["rows"]}
    assert set(after) == set(before)
    for stage in manifest["stages"]:
        if statuses[stage["name"]] == "skipped":
            when = stage["ran_at"][:16].replace("T", " ")
            assert after[stage["name"]][1:3] == [f"skipped (ran {when})", before[stage["name"]][2]], (after[stage["name"]], before[stage["name"]])
    assert after["engine"][1:3] == ["not run", ""]
