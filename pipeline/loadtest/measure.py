"""One load point, measured the way perf_analyzer does: warm up, then fixed-length windows until
the last three agree (throughput and mean latency within 10%), bounded in time.

The engine keeps running while Triton's statistics are fetched on a helper thread at each window
boundary, so the fetch never stalls the load. Server counters are also read before the point
starts and after it drained, which gives Triton's exact success count for the whole point to set
against the client's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pipeline.core.pausepoints import pause_point
from pipeline.loadtest.recorder import Recorder
from pipeline.loadtest.server_stats import ServerCounters
from pipeline.loadtest.window import Mark, Window, is_stable

log = logging.getLogger(__name__)

_STATS_TIMEOUT_S = 3.0
_READ_BEFORE_START_NS = 500_000_000  # a shard's first server read, this long before its shared start
_SETTLE_S, _SETTLE_READS = 0.02, 50  # a settled read takes 20 ms when nothing is in flight, and gives up after 1 s


class Engine(Protocol):
    """What the controller needs of a load engine (HTTP or gRPC)."""

    @property
    def recorders(self) -> list[Recorder]: ...
    def start(self) -> None: ...
    def run_until(self, deadline_ns: int) -> None: ...
    def finish(self, drain_s: float) -> None: ...
    @property
    def unsent(self) -> list[int]: ...


@dataclass(frozen=True)
class WindowSettings:
    """How a point is measured (seconds)."""

    window_s: float = 1.0
    warmup_s: float = 1.0
    max_s: float = 30.0
    stable_windows: int = 3
    threshold: float = 0.10
    drain_s: float = 5.0
    # A shard of a distributed test runs every window up to max_s (the stability of the whole load
    # is judged when the shards are merged), and waits settle_s after its drain before the last
    # server read, so that the other shards' last requests are in it.
    fixed: bool = False
    settle_s: float = 0.0
    # How long a point waits for a server that went away to come back (a supervised `serve` restarts a
    # crashed one); 0: a window without one success ends the point. Windows in which the server went
    # away or restarted are named in the result and left out of stability and statistics.
    restart_wait_s: float = 0.0


@dataclass
class Measurement:
    """What the controller saw; :mod:`pipeline.loadtest.runner` turns it into results."""

    recorders: list[Recorder]
    windows: list[Window]
    stable: bool
    overloaded: bool  # open loop: the server completed clearly less than the offered rate
    aborted: str | None
    wall_seconds: float
    unsent: list[int]
    server_window: list[ServerCounters | None]  # per endpoint, over the used windows
    server_total: list[ServerCounters | None]  # per endpoint, over the whole point
    server_notes: list[str]
    disrupted: list[str] = field(default_factory=list)  # "window N: why", windows the server went away or restarted in
    clean_tail: int | None = None  # windows after the last disrupted one (None: all of them)

    def used(self, count: int) -> list[Window]:
        return self.windows[-count:] if count else []

    def usable(self, count: int) -> int:
        """How many of the last windows the results use: ``count``, fewer after a disruption."""
        return min(count, len(self.windows) if self.clean_tail is None else self.clean_tail)


StatsFetch = Callable[[], ServerCounters]


def measure(
    engine: Engine,
    settings: WindowSettings,
    fetchers: Sequence[StatsFetch],
    offered_rps: float | None = None,
    *,
    cpu: Callable[[], float] = time.process_time,
    start_ns: int | None = None,
    after_disruption: Callable[[], bool] | None = None,
) -> Measurement:
    """Run one point on ``engine``; ``fetchers`` read each endpoint's server counters.

    ``cpu``: the client's CPU seconds so far (this process; worker processes add theirs).
    ``start_ns``: start the load at this ``perf_counter_ns`` instant (a shard's shared start).
    ``after_disruption``: called at each window's end after the server went away until it returns True
    (what the load needs set up again on a restarted server: shared-memory registrations).

    ``offered_rps`` (open loop, all endpoints together): when the last windows all complete less
    than ``1 - threshold`` of it, the server is overloaded — its queue only grows, so the point
    can never be stable and ends at once, marked ``overloaded``."""
    recorders = engine.recorders
    notes = [""] * len(fetchers)
    if start_ns is not None:
        # the other shards' preparation (their request checks) is done by now, and their load not begun
        _sleep_until(start_ns - _READ_BEFORE_START_NS)
    before = [_read_settled(f, notes, i) for i, f in enumerate(fetchers)]
    probe = _Probe(fetchers)
    try:
        if start_ns is not None:
            _sleep_until(start_ns)
        began = time.perf_counter_ns() if start_ns is None else start_ns
        bound = began + int(settings.max_s * 1e9)
        start = Mark.take(recorders, began, cpu())
        engine.start()
        engine.run_until(min(began + int(settings.warmup_s * 1e9), bound))
        # a shard's windows lie on the shared schedule, so that window i of every shard is one interval
        warm = Mark.take(recorders, began + int(settings.warmup_s * 1e9) if settings.fixed else time.perf_counter_ns(), cpu())
        aborted = _dead(Window(start, warm))
        down_since: int | None = None
        if aborted and settings.restart_wait_s > 0:  # gone during the warm-up: wait for it as in a window
            aborted, down_since = None, start.at_ns
        marks, stats = [warm], [probe.read()]
        windows: list[Window] = []
        stable = overloaded = False
        throughputs: list[float] = []
        latencies: list[float] = []
        dropped: dict[int, str] = {}  # window number → why it is left out
        clean_from = 0  # index of the first window after the last disruption
        restore = False  # after_disruption still to succeed
        recovering = False  # after a disruption, until a window without errors
        step = int(settings.window_s * 1e9)
        while aborted is None and (marks[-1].at_ns + step <= bound if settings.fixed else marks[-1].at_ns < bound):
            due = min(marks[-1].at_ns + step, bound)
            engine.run_until(due)
            mark = Mark.take(recorders, due if settings.fixed else time.perf_counter_ns(), cpu())
            marks.append(mark)
            stats.append(probe.read())
            window = Window(marks[-2], mark)
            windows.append(window)
            pause_point("loadtest.window")  # tests hold a load test here, mid-load, to interrupt it (pipeline/core/pausepoints.py)
            throughputs.append(window.throughput)
            latencies.append(window.mean_latency_ns(recorders))
            log.debug(
                "  window %d: %.0f req/s, mean %.3f ms, %d errors",
                len(windows), window.throughput, latencies[-1] / 1e6, window.errors,
            )
            if window.dropped:
                dropped[len(windows)] = f"{window.dropped} requests lost with their connection (the server went away or restarted)"
                clean_from = len(windows)
                restore, recovering = after_disruption is not None, True
            elif restore:  # this window's requests ran before the setup was restored
                dropped[len(windows)] = "the load's setup (shared memory) not yet registered again with the restarted server"
                clean_from = len(windows)
            elif recovering and window.errors:  # e.g. answers before the new server has loaded the model
                dropped[len(windows)] = f"the server was still coming back ({window.errors} failed requests)"
                clean_from = len(windows)
            else:
                recovering = False
            if restore:
                restore = not after_disruption()  # type: ignore[misc]
            aborted = _dead(window)
            if aborted and settings.restart_wait_s > 0:
                down_since = window.start.at_ns if down_since is None else down_since
                if (window.end.at_ns - down_since) / 1e9 <= settings.restart_wait_s:
                    aborted = None  # waiting for the server to come back
                else:
                    aborted = f"the server did not come back within {settings.restart_wait_s:g} s ({aborted})"
            elif window.successes:
                down_since = None
            if offered_rps and len(throughputs) >= settings.stable_windows and all(
                t < (1 - settings.threshold) * offered_rps for t in throughputs[-settings.stable_windows :]
            ):
                overloaded = True
                break
            stable = is_stable(throughputs[clean_from:], latencies[clean_from:], count=settings.stable_windows, threshold=settings.threshold)
            if stable and not settings.fixed:
                break
        engine.finish(settings.drain_s)
        time.sleep(settings.settle_s)
        wall = (time.perf_counter_ns() - began) / 1e9
        _restarted_windows(stats, dropped)
        clean_tail = len(windows) - max(dropped, default=0)
        used = min(settings.stable_windows, clean_tail)
        first = len(marks) - 1 - used
        start_stats = [_resolve(f, notes, i) for i, f in enumerate(stats[first])] if used else [None] * len(fetchers)
        end_stats = [_resolve(f, notes, i) for i, f in enumerate(stats[-1])] if used else [None] * len(fetchers)
    finally:
        probe.close()
    after = [_read_settled(f, notes, i) for i, f in enumerate(fetchers)]
    return Measurement(
        recorders=recorders,
        windows=windows,
        stable=stable,
        overloaded=overloaded,
        aborted=aborted,
        wall_seconds=wall,
        unsent=engine.unsent,
        server_window=[_delta(e, s) for s, e in zip(start_stats, end_stats)],
        server_total=[_delta(a, b) for b, a in zip(before, after)],
        server_notes=notes,
        disrupted=[f"window {n}: {why}" for n, why in sorted(dropped.items())],
        clean_tail=clean_tail,
    )


def _restarted_windows(stats: list[list[Future | None]], dropped: dict[int, str]) -> None:
    """Add to ``dropped`` the windows over which an endpoint's success count went down: Triton's
    statistics started again from zero, so a new server process answered (stats[j] is read at mark j,
    window n spans marks n-1 and n)."""
    for n in range(1, len(stats)):
        for before, after in zip(stats[n - 1], stats[n]):
            start, end = _settled(before), _settled(after)
            if start is not None and end is not None and end.success_count < start.success_count:
                why = "Triton's statistics started again from zero (a new server process)"
                dropped[n] = f"{dropped[n]}; {why}" if n in dropped else why


def _settled(future: Future | None) -> ServerCounters | None:
    """A finished statistics read's counters (None if it failed or never finished)."""
    if future is None:
        return None
    try:
        return future.result(timeout=_STATS_TIMEOUT_S)
    except (OSError, FutureTimeout):
        return None


def _sleep_until(at_ns: int) -> None:
    time.sleep(max(0.0, (at_ns - time.perf_counter_ns()) / 1e9))


def _dead(window: Window) -> str | None:
    """A window with errors and not one success means the server is gone (or rejects everything)."""
    if window.successes == 0 and window.errors > 0:
        return f"no successful response in {window.seconds:.1f} s ({window.errors} errors)"
    return None


class _Probe:
    """Reads every endpoint's counters on helper threads while the load runs — at most one read
    per endpoint at a time, so a server that stopped answering cannot pile reads up."""

    def __init__(self, fetchers: Sequence[StatsFetch]) -> None:
        self._fetchers = fetchers
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(fetchers)), thread_name_prefix="triton-stats")
        self._last: list[Future | None] = [None] * len(fetchers)

    def read(self) -> list[Future | None]:
        """Start a read per endpoint (``None`` where the previous one is still running)."""
        out: list[Future | None] = []
        for i, fetch in enumerate(self._fetchers):
            previous = self._last[i]
            if previous is not None and not previous.done():
                out.append(None)
                continue
            self._last[i] = self._pool.submit(fetch)
            out.append(self._last[i])
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _resolve(future: Future | None, notes: list[str], index: int) -> ServerCounters | None:
    if future is None:
        notes[index] = notes[index] or "Triton statistics unavailable: a statistics read did not return in time"
        return None
    try:
        return future.result(timeout=_STATS_TIMEOUT_S)
    except (OSError, FutureTimeout) as exc:
        notes[index] = notes[index] or f"Triton statistics unavailable: {exc or 'no answer'}"
        return None


def _read_settled(fetch: StatsFetch, notes: list[str], index: int) -> ServerCounters | None:
    """The counters once every request answered so far is in them. Triton counts a request after its response is
    sent, so a read right after the last response (the request check before a point, the drain after it) can miss
    requests the client has counted: read until two reads ``_SETTLE_S`` apart agree (at most ``_SETTLE_READS``)."""
    now = _read_now(fetch, notes, index)
    for _ in range(_SETTLE_READS):
        if now is None:
            return None
        time.sleep(_SETTLE_S)
        again = _read_now(fetch, notes, index)
        if again is not None and (again.success_count, again.fail_count) == (now.success_count, now.fail_count):
            return again
        now = again
    return now


def _read_now(fetch: StatsFetch, notes: list[str], index: int) -> ServerCounters | None:
    try:
        return fetch()
    except OSError as exc:
        notes[index] = notes[index] or f"Triton statistics unavailable: {exc}"
        return None


def _delta(end: ServerCounters | None, start: ServerCounters | None) -> ServerCounters | None:
    return None if end is None or start is None else end - start


def window_latencies(m: Measurement, used: int, endpoint: int | None = None) -> np.ndarray:
    """Latencies (ns) of the used windows, for one endpoint or all."""
    windows = m.used(used)
    if not windows:
        return np.empty(0, dtype=np.int64)
    return Window(windows[0].start, windows[-1].end).latencies_ns(m.recorders, endpoint)


def window_lags(m: Measurement, used: int, endpoint: int) -> np.ndarray:
    """Open-loop send lags (ns) of the used windows for one endpoint."""
    windows = m.used(used)
    if not windows:
        return np.empty(0, dtype=np.int64)
    lag = np.frombuffer(m.recorders[endpoint].lag_ns, dtype=np.int64)
    return lag[windows[0].start.lag_pos[endpoint] : windows[-1].end.lag_pos[endpoint]]
