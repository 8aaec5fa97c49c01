"""tune.json schema, trials.csv, plots, and the accuracy/throughput Pareto front."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from pipeline.tune.results import accuracy_of, pareto, pareto_table, tune_document, write_reports
from pipeline.tune.space import Candidate
from tests.tune.helpers import model_tune, point, trial

ENTRY_KEYS = {"config", "infer_per_s", "p99_ms", "load", "meets_slo"}
CONFIG_KEYS = {"instance_count", "max_batch_size", "preferred_batch_sizes", "max_queue_delay_us"}


def fp32_tune(model: str = "digits_fp32", scale: float = 1.0):  # type: ignore[no-untyped-def]
    return model_tune(model, [
        trial(Candidate(1, 64, (32, 64), 100), [point(1, 300 * scale, 3), point(2, 500 * scale, 6), point(4, 600 * scale, 14)], baseline=True),
        trial(Candidate(2, 64, (32, 64), 100), [point(1, 350 * scale, 2), point(2, 650 * scale, 5), point(4, 800 * scale, 9), point(8, 820 * scale, 20)]),
        trial(Candidate(1, 64, (32, 64), 0), [point(1, 200 * scale, 11)]),
    ])


def test_best_is_the_highest_throughput_under_the_slo() -> None:
    job = fp32_tune()
    assert job.best.candidate == Candidate(2, 64, (32, 64), 100)
    best = job.best.to_dict()
    assert (best["infer_per_s"], best["p99_ms"], best["load"], best["meets_slo"]) == (800, 9, {"concurrency": 4}, True)
    assert best["fixed_load"]["p99_ms"] == 9
    missed = job.trials[2].to_dict()
    assert missed["meets_slo"] is False and missed["p99_ms"] == 11  # the closest it came


def test_a_candidate_must_beat_the_published_config_by_more_than_noise() -> None:
    published = trial(Candidate(1, 64, (32, 64), 100), [point(1, 500, 3)], baseline=True)
    for gain, wins in ((0, False), (1.03, False), (1.10, True)):
        other = trial(Candidate(2, 64, (32, 64), 100), [point(1, 500 * gain, 3)])
        assert model_tune("m_fp32", [published, other]).best is (other if wins else published)
    # A published config that misses the SLO is beaten by any candidate that meets it.
    missing = trial(Candidate(1, 64, (32, 64), 100), [point(1, 500, 30)], baseline=True)
    meets = trial(Candidate(2, 64, (32, 64), 100), [point(1, 100, 3)])
    assert model_tune("m_fp32", [missing, meets]).best is meets


def test_document_has_the_issue_schema_for_one_model(tmp_path: Path) -> None:
    doc = tune_document([fp32_tune()], {"slo_p99_ms": 10})
    assert doc["slo_p99_ms"] == 10
    for entry in (doc["baseline"], doc["best"], *doc["trials"]):
        assert ENTRY_KEYS <= set(entry) and set(entry["config"]) == CONFIG_KEYS
    assert doc["models"]["digits_fp32"]["best"] == doc["best"]
    assert doc["baseline"]["config"]["instance_count"] == 1 and len(doc["trials"]) == 3


def test_reports_are_written(tmp_path: Path) -> None:
    written = write_reports([fp32_tune(), fp32_tune("digits_int8", 1.5)], {"slo_p99_ms": 10}, tmp_path / "r", tmp_path)
    assert {p.name for p in written} == {"tune.json", "trials.csv", "throughput_vs_p99.png", "pareto.png"}
    rows = list(csv.DictReader(open(tmp_path / "r" / "trials.csv")))
    assert len(rows) == 6 and rows[0]["published"] == "True" and rows[1]["instance_count"] == "2"
    doc = json.loads((tmp_path / "r" / "tune.json").read_text())
    assert set(doc["models"]) == {"digits_fp32", "digits_int8"} and "best" not in doc
    assert (tmp_path / "r" / "pareto.png").stat().st_size > 1000


def write_accuracy(workdir: Path, fp32: float, int8: float, metric: str | None = None) -> None:
    (workdir / "digits").mkdir(parents=True)
    (workdir / "digits" / "accuracy.json").write_text(json.dumps({"reference": "fp32-onnx (ONNX Runtime CPU)", "variants": [
        {"precision": "int8", "kind": "onnx", "accuracy": int8, "reference_accuracy": fp32, "accuracy_metric": metric}]}))


def test_accuracy_comes_from_the_build_report(tmp_path: Path) -> None:
    write_accuracy(tmp_path, 0.98, 0.97)
    assert accuracy_of("digits_int8", None, tmp_path)["top1"] == 0.97  # type: ignore[index]
    assert accuracy_of("digits_fp32", None, tmp_path)["top1"] == 0.98  # type: ignore[index]
    assert accuracy_of("digits_fp16", None, tmp_path) is None
    assert accuracy_of("other", None, tmp_path) is None


def test_pareto_marks_dominated_variants(tmp_path: Path) -> None:
    write_accuracy(tmp_path, 0.98, 0.97)
    faster_int8 = pareto([fp32_tune(), fp32_tune("digits_int8", 1.5)], tmp_path)
    assert [p["dominated"] for p in faster_int8] == [False, False]  # a trade-off: both on the front
    slower_int8 = pareto([fp32_tune(), fp32_tune("digits_int8", 0.5)], tmp_path)
    assert [p["dominated"] for p in slower_int8] == [False, True]  # less accurate and slower


def test_the_pareto_table_names_what_the_accuracy_is(tmp_path: Path) -> None:
    write_accuracy(tmp_path / "r2", 0.91, 0.90, metric="R²")  # a regression model: its accuracy is R², not top-1
    points = pareto([fp32_tune(), fp32_tune("digits_int8", 1.5)], tmp_path / "r2")
    assert [p["accuracy_metric"] for p in points] == ["R²", "R²"]
    assert [c.header for c in pareto_table(points, 10).columns][:2] == ["variant", "R²"]
    write_accuracy(tmp_path / "old", 0.98, 0.97)  # a report that does not say: "accuracy", never a guess
    assert pareto_table(pareto([fp32_tune()], tmp_path / "old"), 10).columns[1].header == "accuracy"


def test_apply_is_refused_before_any_measurement_when_it_could_not_write(tmp_path: Path) -> None:
    import pytest

    from pipeline.core.errors import PipelineError
    from pipeline.tune.apply import check_can_apply

    published = [trial(Candidate(1, 64, (32, 64), 100), [point(1, 500, 3)], baseline=True)]
    with pytest.raises(PipelineError, match="only for models the pipeline published .* not 'add'"):
        check_can_apply(model_tune("add", published, tmp_path / "add"), None, tmp_path)
    check_can_apply(model_tune("add", published, tmp_path / "add"), "cpu-1", tmp_path)  # a profile config is fine
    with pytest.raises(PipelineError, match="which has no model 'digits_fp32'"):
        check_can_apply(model_tune("digits_fp32", published, None), None, tmp_path)
