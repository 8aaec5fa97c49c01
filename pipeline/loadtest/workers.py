"""Load from several worker processes on one machine, measured as one: ``loadtest --workers N``.

One Python process drives one core; past that, N worker processes each run their own engine
(HTTP epoll loop or gRPC channel) with their share of the load (:func:`policy.split`), started
together. The parent keeps the controller: it tells every worker how long to run (an absolute
``perf_counter_ns`` deadline — ``CLOCK_MONOTONIC`` is one clock for every process of the
machine), and each worker answers with the raw samples it recorded since its last answer. The
parent appends them to one :class:`Recorder` per endpoint, so windows, stability, percentiles,
Triton's statistics and the Prometheus deltas are computed exactly as for one process, from every
sample (no merged percentiles, no averages of percentiles), and the server is read once per point.

Between two deadlines a worker keeps its engine running while it waits for the next one, so the
load never pauses for the parent. A worker that dies or cannot start is named in the point's
``incomplete`` note; the other workers' samples are kept.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.loadtest.client import Endpoint
from pipeline.loadtest.policy import Policy, split
from pipeline.loadtest.recorder import Recorder

log = logging.getLogger(__name__)

_IDLE_SLICE_NS = 1_000_000  # how long a worker serves its engine between looks at the pipe
_START_S = 60.0  # a spawned worker imports numpy and the engines first
_ANSWER_S = 30.0  # a worker that does not answer within this after its deadline is taken for dead


@dataclass(frozen=True)
class EngineSpec:
    """What a worker needs to build its engine for a point (picklable)."""

    protocol: str
    targets: list[tuple[Endpoint, list[bytes]]]
    timeout_s: float
    max_connections: int


def build_engine(spec: EngineSpec, policy: Policy) -> Any:
    """The HTTP or gRPC engine for ``policy`` (also used by the runner in one process)."""
    if spec.protocol == "grpc":
        from pipeline.loadtest.h2_load import H2GrpcEngine

        return H2GrpcEngine(spec.targets, policy, timeout_s=spec.timeout_s, max_in_flight=spec.max_connections)
    from pipeline.loadtest.engine import HttpEngine

    return HttpEngine(spec.targets, policy, timeout_s=spec.timeout_s, max_connections=spec.max_connections)


# -- the worker process ---------------------------------------------------------------------------
def _report(engine: Any, sent_pos: list[list[int]], final: bool) -> dict[str, Any]:
    """What ``engine`` recorded since the last report, per endpoint, and this process's CPU time."""
    parts = []
    for i, r in enumerate(engine.recorders):
        lat_pos, lag_pos = sent_pos[i]
        parts.append({
            "latency": r.latency_ns[lat_pos:].tobytes(), "lag": r.lag_ns[lag_pos:].tobytes(),
            "errors": dict(r.errors), "samples": {k: list(v) for k, v in r.error_samples.items()},
            "sent": r.sent, "abandoned": r.abandoned,
        })  # fmt: skip
        sent_pos[i] = [len(r.latency_ns), len(r.lag_ns)]
    return {"parts": parts, "cpu_s": time.process_time(), "unsent": list(engine.unsent) if final else None}


def worker_main(pipe: Any) -> None:
    """A worker's loop: ``("point", spec, policy)``, ``("run", deadline_ns)``, ``("finish", drain_s)``, ``("quit",)``."""
    engine: Any = None
    sent_pos: list[list[int]] = []
    pipe.send(("ready", None))  # imports done: the parent starts no point before every worker is here
    while True:
        while engine is not None and not pipe.poll(0):
            engine.run_until(time.perf_counter_ns() + _IDLE_SLICE_NS)
        message = pipe.recv()
        kind = message[0]
        try:
            if kind == "quit":
                return
            if kind == "point":
                engine = build_engine(message[1], message[2])
                sent_pos = [[0, 0] for _ in engine.recorders]
                engine.start()
                pipe.send(("ok", time.process_time()))
            elif kind == "run":
                engine.run_until(message[1])
                pipe.send(("ok", _report(engine, sent_pos, final=False)))
            elif kind == "finish":
                engine.finish(message[1])
                pipe.send(("ok", _report(engine, sent_pos, final=True)))
                engine = None
        except Exception as exc:  # noqa: BLE001 - whatever stops a worker is reported by the parent with its name
            engine = None
            pipe.send(("error", f"{type(exc).__name__}: {getattr(exc, 'problem', exc)}"))


# -- the parent's side ----------------------------------------------------------------------------
@dataclass
class _Worker:
    index: int
    process: Any
    pipe: Any
    busy: bool = False  # has a share of the current point
    cpu_s: float = 0.0
    cpu_base: float = 0.0
    errors: list[dict[str, int]] = field(default_factory=list)
    samples: list[dict[str, list[str]]] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    abandoned: list[int] = field(default_factory=list)
    unsent: list[int] = field(default_factory=list)
    successes: int = 0
    failure: str = ""


class WorkerPool:
    """N worker processes for the sweep of one model; use as a context manager."""

    def __init__(self, workers: int, spec: EngineSpec) -> None:
        self.spec = spec
        context = multiprocessing.get_context("spawn")  # no fork of a process that holds threads and sockets
        self._workers = []
        for i in range(workers):
            parent, child = context.Pipe()
            process = context.Process(target=worker_main, args=(child,), name=f"loadtest-worker-{i}", daemon=True)
            process.start()
            child.close()
            self._workers.append(_Worker(i, process, parent))
        for w in self._workers:
            try:
                ready = w.pipe.poll(_START_S) and w.pipe.recv()[0] == "ready"
            except (EOFError, OSError):
                ready = False
            if not ready:
                log.warning("load-test worker %d did not start within %g s", w.index, _START_S)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ask every worker to quit, then make sure it has."""
        for w in self._workers:
            try:
                w.pipe.send(("quit",))
            except OSError:
                pass
        for w in self._workers:
            w.process.join(timeout=5)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.pipe.close()

    def engine(self, policy: Policy) -> PoolEngine:
        """An engine that runs ``policy`` split over the workers."""
        return PoolEngine(self, policy)

    @property
    def workers(self) -> list[_Worker]:
        return self._workers


class PoolEngine:
    """The :class:`~pipeline.loadtest.measure.Engine` interface over a :class:`WorkerPool`."""

    def __init__(self, pool: WorkerPool, policy: Policy) -> None:
        self._pool = pool
        self._policy = policy
        endpoints = len(pool.spec.targets)
        self.recorders = [Recorder() for _ in range(endpoints)]
        self._shares = split(policy, len(pool.workers))
        for w in pool.workers:
            w.busy, w.cpu_s, w.successes, w.failure = False, 0.0, 0, ""
            w.errors = [{} for _ in range(endpoints)]
            w.samples = [{} for _ in range(endpoints)]
            w.sent, w.abandoned, w.unsent = [0] * endpoints, [0] * endpoints, [0] * endpoints
        self._cpu_base = time.process_time()

    @property
    def unsent(self) -> list[int]:
        return [sum(w.unsent[i] for w in self._pool.workers) for i in range(len(self.recorders))]

    @property
    def failures(self) -> list[str]:
        """One line per worker that died, could not start, or had load and not one success."""
        out = []
        for w in self._pool.workers:
            if w.failure:
                out.append(f"worker {w.index}: {w.failure}")
            elif w.busy and not w.successes and any(w.errors[i] for i in range(len(self.recorders))):
                kinds = ", ".join(sorted({k for e in w.errors for k in e}))
                detail = next((s[0] for e in w.samples for s in e.values() if s), "")
                out.append(f"worker {w.index}: no successful response ({kinds}{': ' + detail if detail else ''})")
        return out

    def cpu_seconds(self) -> float:
        """Client CPU of the point so far: the workers' and the parent's own."""
        return sum(w.cpu_s for w in self._pool.workers) + time.process_time() - self._cpu_base

    def start(self) -> None:
        spec = self._pool.spec
        for w, share in zip(self._pool.workers, self._shares):
            if share is None:
                continue
            w.busy = True
            if not w.process.is_alive():
                w.failure = f"process {w.process.pid} exited before this point (code {w.process.exitcode})"
            else:
                self._send(w, ("point", spec, share))
        for w in self._live():
            w.cpu_base = self._answer(w) or 0.0  # what it spent before this point (start-up, earlier points) is not counted

    def run_until(self, deadline_ns: int) -> None:
        live = [w for w in self._live() if self._send(w, ("run", deadline_ns))]
        for w in live:
            self._absorb(w, self._answer(w, deadline_ns))

    def stop(self) -> None:
        """Nothing to do: the workers send nothing new once told to finish."""

    def finish(self, drain_s: float) -> None:
        live = [w for w in self._live() if self._send(w, ("finish", drain_s))]
        for w in live:
            report = self._answer(w, time.perf_counter_ns() + int(drain_s * 1e9))
            self._absorb(w, report)
            if report is not None:
                w.unsent = report["unsent"]

    # -- plumbing --------------------------------------------------------------------------------
    def _live(self) -> list[_Worker]:
        return [w for w in self._pool.workers if w.busy and not w.failure]

    def _send(self, w: _Worker, message: tuple) -> bool:
        try:
            w.pipe.send(message)
            return True
        except OSError as exc:
            w.failure = self._death(w, exc)
            return False

    def _answer(self, w: _Worker, after_ns: int | None = None) -> Any:
        wait = _ANSWER_S + max(0.0, ((after_ns or 0) - time.perf_counter_ns()) / 1e9)
        try:
            if not w.pipe.poll(wait):
                w.failure = f"no answer within {wait:.0f} s"
                return None
            status, payload = w.pipe.recv()
        except (EOFError, OSError) as exc:
            w.failure = self._death(w, exc)
            return None
        if status == "error":
            w.failure = payload
            return None
        return payload

    @staticmethod
    def _death(w: _Worker, exc: BaseException) -> str:
        w.process.join(timeout=1)
        code = w.process.exitcode
        return f"process {w.process.pid} exited (code {code})" if code is not None else f"lost its pipe ({exc})"

    def _absorb(self, w: _Worker, report: dict[str, Any] | None) -> None:
        """Append a worker's new samples to the merged recorders, in the order they arrive."""
        if report is None:
            return
        w.cpu_s = report["cpu_s"] - w.cpu_base
        for i, part in enumerate(report["parts"]):
            merged = self.recorders[i]
            merged.latency_ns.frombytes(part["latency"])
            merged.lag_ns.frombytes(part["lag"])
            w.successes += len(part["latency"]) // 8
            w.errors[i], w.samples[i] = part["errors"], part["samples"]
            w.sent[i], w.abandoned[i] = part["sent"], part["abandoned"]
            merged.errors = _sum_counts(x.errors[i] for x in self._pool.workers)
            merged.error_samples = _first_samples(x.samples[i] for x in self._pool.workers)
            merged.sent = sum(x.sent[i] for x in self._pool.workers)
            merged.abandoned = sum(x.abandoned[i] for x in self._pool.workers)


def _sum_counts(dicts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, n in d.items():
            out[k] = out.get(k, 0) + n
    return out


def _first_samples(dicts: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in dicts:
        for k, v in d.items():
            out.setdefault(k, []).extend(s for s in v if s not in out[k])
    return {k: v[:3] for k, v in out.items()}

