"""The HTML page's MLPerf section: the newest ``loadtest --scenario`` run's ``mlperf.json`` (each run's verdict, its
metric and reasons) and, for accuracy mode, ``mlperf_accuracy.json`` (the served judgement of LoadGen's logged
answers). Real files as loadtest writes them, the real page writer; the browser checks of the page are in
tests/reports/test_report_html.py."""

from __future__ import annotations

import json
import os
from html.parser import HTMLParser
from pathlib import Path

from pipeline.reports.html import write_html_report

PERFORMANCE = [
    {"model": "digits_fp32", "scenario": "Server", "mode": "PerformanceOnly", "result": "VALID", "metric": "completed samples per second",
     "value": 198.7, "unit": "samples/s", "percentiles_ns": {"50.00": 1.2e6, "99.00": 4.5e6}, "query_count": 2000, "reasons": []},
    {"model": "digits_int8", "scenario": "Server", "mode": "PerformanceOnly", "result": "INVALID", "metric": "completed samples per second",
     "value": 190.0, "unit": "samples/s", "percentiles_ns": {"50.00": 2.0e6, "99.00": 31e6}, "query_count": 2000,
     "reasons": ["the latency bound was not met (its percentile over the bound)"]},
]


class Rows(HTMLParser):
    """Every table row of the page: its class and its cells' text."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append((dict(attrs).get("class") or "", []))
        elif tag in ("td", "th"):
            self._cell = []

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self.rows:
            self.rows[-1][1].append("".join(self._cell).strip())
            self._cell = None


def page_rows(reports: Path) -> tuple[str, dict[str, tuple[str, list[str]]]]:
    text = write_html_report(reports / "no-builds", reports).read_text()
    parser = Rows()
    parser.feed(text)
    return text, {cells[0]: (style, cells) for style, cells in parser.rows if cells}


def test_the_newest_scenario_run_is_on_the_page_an_invalid_one_marked_with_its_reason(tmp_path: Path) -> None:
    older, newer = tmp_path / "20261206-010000", tmp_path / "20261206-020000"
    for folder, rows in ((older, PERFORMANCE[:1]), (newer, PERFORMANCE)):
        folder.mkdir()
        (folder / "mlperf.json").write_text(json.dumps({"runs": rows}))
    os.utime(older / "mlperf.json", (1, 1))
    text, rows = page_rows(tmp_path)
    assert "MLPerf scenarios 20261206-020000" in text and "1 older run(s) not shown" in text
    style, cells = rows["digits_int8"]
    assert "bad" in style and cells[1:5] == ["Server", "PerformanceOnly", "INVALID", "completed samples per second: 190.0 samples/s"]
    assert cells[5:] == ["2.000", "31.000", "2,000", "the latency bound was not met (its percentile over the bound)"]
    assert "bad" not in rows["digits_fp32"][0] and rows["digits_fp32"][1][3] == "VALID"


def test_an_accuracy_run_shows_pass_or_fail_and_the_served_judgement(tmp_path: Path) -> None:
    run = tmp_path / "20261206-030000"
    run.mkdir()
    accuracy = {"model": "digits_int8", "scenario": "Offline", "mode": "accuracy", "result": "FAIL", "metric": "served task metric",
                "value": {"probs": 0.9612}, "unit": "", "samples": 449, "query_count": None,
                "reasons": ["MLPerf accuracy target: output 'probs' (classes): 0.9612 < 99.9% of served FP32's 0.9755 (0.9745)"]}
    (run / "mlperf.json").write_text(json.dumps({"runs": [accuracy]}))
    judged = {"models": [{"model": "digits_int8", "version": 1, "passed": False, "outputs": {"probs": {
        "kind": "classes", "served_metric": 0.9612, "inprocess_metric": 0.9612, "agreement": 0.98, "max_abs_diff": 0.0}},
        "gates": [{"output": "probs", "metric": "MLPerf target (99.9% of FP32's)", "value": 0.9612, "limit": 0.9745, "verdict": "fail"}]}],
        "not_verified": {"digits_fp32_trt": "a TensorRT plan needs a GPU server"}}
    (run / "mlperf_accuracy.json").write_text(json.dumps(judged))
    text, rows = page_rows(tmp_path)
    style, cells = rows["digits_int8"]  # the last row named so: the MLPerf target's row of the served table
    assert "bad" in style and cells[3:6] == ["MLPerf target (99.9% of FP32's)", "96.12%", "≥ 97.45%"] and cells[-1] == "FAIL"
    assert "probs 96.12% on 449 samples" in text and "0.9612 &lt; 99.9% of served FP32" in text
    assert rows["digits_fp32_trt"][1][-1] == "not verified"
