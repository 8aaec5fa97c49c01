"""One LoadGen run: LoadGen's query sample library over samples already encoded in memory, a system under test
bridged to LoadGen's callbacks, and the four logs in a folder of their own; the verdict is read back from them.

LoadGen issues queries from its own threads and is told of each answer through ``QuerySamplesComplete``; a system
under test (:class:`SystemUnderTest`) gets ``(response id, sample index)`` pairs and answers each with
:func:`complete`, from any thread, when its response arrives."""

from __future__ import annotations

import array
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.errors import require
from pipeline.loadtest.loadgen.settings import ScenarioSettings, loadgen
from pipeline.loadtest.loadgen.verdict import ACCURACY, LOGS, ScenarioVerdict, verdict_from_log

log = logging.getLogger(__name__)


class SystemUnderTest(Protocol):
    """What LoadGen drives: ``issue`` sends the samples (each a response id and a sample index) and returns at once;
    each answer goes back through :func:`complete`. ``flush`` is LoadGen's hint that no more queries come soon."""

    name: str

    def issue(self, samples: Sequence[tuple[int, int]]) -> None: ...

    def flush(self) -> None: ...


def complete(answers: Sequence[tuple[int, bytes | None]]) -> None:
    """Tell LoadGen that each ``(response id, data)`` is answered; ``data`` (the response's bytes) is what accuracy
    mode logs, None in a performance run."""
    lg = loadgen()
    held = []  # LoadGen copies the bytes before QuerySamplesComplete returns: keep them alive until then
    responses = []
    for response_id, data in answers:
        if data:
            buffer = array.array("B", data)
            held.append(buffer)
            address, length = buffer.buffer_info()
            responses.append(lg.QuerySampleResponse(response_id, address, length))
        else:
            responses.append(lg.QuerySampleResponse(response_id, 0, 0))
    lg.QuerySamplesComplete(responses)
    del held


class AnswersAtOnce:
    """A system under test that answers every sample the moment it is issued, on LoadGen's thread: what LoadGen and
    this bridge cost per query, with no server behind them."""

    name = "answers-at-once"

    def issue(self, samples: Sequence[tuple[int, int]]) -> None:
        complete([(response_id, None) for response_id, _ in samples])

    def flush(self) -> None:
        pass


def run_scenario(settings: ScenarioSettings, sut: SystemUnderTest, samples: int, out_dir: Path,
                 performance_samples: int | None = None, *, trace: bool = True) -> ScenarioVerdict:
    """Run ``settings`` against ``sut`` over ``samples`` samples (indices 0 … samples-1; ``performance_samples`` of
    them in a performance run, all by default), LoadGen's four logs written to ``out_dir`` (replaced), and return
    their verdict. ``trace=False`` leaves the trace log empty (a megabyte per thousand queries)."""
    require(samples >= 1, "an MLPerf scenario needs at least one sample", "give the load test evaluation data")
    lg = loadgen()
    out_dir = Path(out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)

    def issue_query(queries: list[Any]) -> None:
        sut.issue([(q.id, q.index) for q in queries])

    def nothing(_indices: list[int]) -> None:  # the samples are encoded before the run and stay in memory
        pass

    handle = lg.ConstructSUT(issue_query, sut.flush)
    qsl = lg.ConstructQSL(samples, min(samples, performance_samples or samples), nothing, nothing)
    output = lg.LogOutputSettings()
    output.outdir = str(out_dir)
    output.copy_summary_to_stdout = False
    log_settings = lg.LogSettings()
    log_settings.log_output = output
    log_settings.enable_trace = trace
    try:
        lg.StartTestWithLogSettings(handle, qsl, settings.test_settings(), log_settings)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(handle)
    missing = [name for name in LOGS if not (out_dir / name).is_file()]
    require(not missing, f"LoadGen wrote no {', '.join(missing)} in {out_dir}", "check that the folder is writable and run again")
    verdict = verdict_from_log(out_dir)
    shown = "not measured" if verdict.value is None else (f"{verdict.value / 1e6:.3f} ms" if verdict.unit == "ns" else f"{verdict.value:,.1f} {verdict.unit}")
    if verdict.mode == "AccuracyOnly":
        log.info("%s %s against %s: the answers to %d samples logged in %s", verdict.scenario, verdict.mode, sut.name, samples, out_dir / ACCURACY)
    else:
        log.debug("%s %s against %s: %s, %s %s", verdict.scenario, verdict.mode, sut.name, verdict.result, verdict.metric, shown)
    return verdict
