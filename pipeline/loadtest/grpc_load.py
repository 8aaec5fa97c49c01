"""gRPC requests serialized once (a ``ModelInferRequest`` as bytes), checked against tritonclient,
and a load engine on grpcio's future API.

``loadtest --protocol grpc`` loads through :mod:`pipeline.loadtest.h2_load` (HTTP/2 framed in an
epoll loop, a fraction of the client CPU per request); :class:`GrpcEngine` stays as the grpcio
reference that ``scripts/bench_grpc.py --engine grpcio`` measures.

Leaner than tritonclient's gRPC clients (no protobuf building per request, no response decoding)
but grpcio still costs far more per call than the HTTP engine: measured here ~200-350 µs of
client CPU per request with this future/callback API, ~350-500 µs with ``grpc.aio`` (HTTP engine:
~15-40 µs). That CPU is taken from a server on the same machine, so compare protocols with the
reported ``client_cpu_us_per_request`` in mind. All requests to one endpoint share one channel
(HTTP/2 multiplexing), as gRPC clients normally do.

Completions arrive on grpcio's threads; the controller's thread sends open-loop requests on
schedule and re-sends after failures with a back-off, so a dead server is not hammered. The
recorders belong to the controller's thread: grpcio's threads hand latencies over in a list
(a numpy view of a recorder array must never see it grow underneath).
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import Any

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.lazy import import_optional
from pipeline.loadtest.client import Endpoint
from pipeline.loadtest.payload import ModelIO, tensor_bytes
from pipeline.loadtest.policy import ClosedLoop, OpenLoop, Policy, backoff_ns
from pipeline.loadtest.recorder import Recorder
from pipeline.loadtest.request_check import DecodedOutputs, compare_with_tritonclient
from pipeline.loadtest.shm import SharedMemoryRegions, Slot, read_outputs

_METHOD = "/inference.GRPCInferenceService/ModelInfer"
_TICK_NS = 5_000_000  # how often the controller's thread looks at retries when nothing is due
# gRPC core follows http_proxy/https_proxy/grpc_proxy, even for loopback; a load generator talks to Triton directly.
_DIRECT = [("grpc.enable_http_proxy", 0)]


def grpc_request_bytes(io: ModelIO, tensors: dict[str, np.ndarray]) -> bytes:
    """A serialized ``ModelInferRequest`` with the tensors as raw little-endian contents."""
    service_pb2 = import_optional("tritonclient.grpc.service_pb2", None, "gRPC load")
    request = service_pb2.ModelInferRequest(model_name=io.name)
    for t in io.inputs:
        array = tensors[t.name]
        request.inputs.add(name=t.name, datatype=t.datatype, shape=list(array.shape))
        request.raw_input_contents.append(tensor_bytes(array))  # BYTES: each element's 4-byte length, then it
    for t in io.outputs:
        request.outputs.add(name=t.name)
    return request.SerializeToString()


def grpc_shm_request_bytes(io: ModelIO, tensors: dict[str, np.ndarray], inputs: dict[str, Slot], outputs: dict[str, Slot]) -> bytes:
    """A serialized ``ModelInferRequest`` whose inputs and outputs are shared-memory slots (no tensor contents):
    the parameters Triton's shared-memory extension reads, as tritonclient's ``set_shared_memory`` writes them."""
    service_pb2 = import_optional("tritonclient.grpc.service_pb2", None, "gRPC load")
    request = service_pb2.ModelInferRequest(model_name=io.name)
    for t in io.inputs:
        _name_slot(request.inputs.add(name=t.name, datatype=t.datatype, shape=list(tensors[t.name].shape)).parameters, inputs[t.name])
    for t in io.outputs:
        _name_slot(request.outputs.add(name=t.name).parameters, outputs[t.name])
    return request.SerializeToString()


def _name_slot(parameters: Any, slot: Slot) -> None:
    """The slot's parameters (the HTTP request's, :meth:`Slot.parameters`) as ``InferParameter`` entries."""
    for key, value in slot.parameters().items():
        if isinstance(value, str):
            parameters[key].string_param = value
        else:
            parameters[key].int64_param = value


def check_grpc_request(endpoint: Endpoint, io: ModelIO, request: bytes, tensors: dict[str, np.ndarray]) -> None:
    """Raise unless the pre-serialized request gives the outputs tritonclient's gRPC client gets."""
    grpcclient = import_optional("tritonclient.grpc", None, "gRPC load")
    ours = grpcclient.InferResult(_exchange(endpoint, io, request))
    compare_with_tritonclient(_grpc_client(endpoint), grpcclient, io, tensors, ours, rtol=1e-5, what="gRPC")


def check_grpc_shm_request(endpoint: Endpoint, io: ModelIO, request: bytes, tensors: dict[str, np.ndarray], regions: SharedMemoryRegions,
                           outputs: dict[str, Slot]) -> None:
    """Raise unless the shared-memory gRPC ``request`` leaves in its output regions what tritonclient's plain
    gRPC request returns for ``tensors``."""
    grpcclient = import_optional("tritonclient.grpc", None, "gRPC load")
    response = _exchange(endpoint, io, request, "each --grpc-url must be the same server as its --url (the regions are registered there) and run on "
                                                "this machine; check --output-shared-memory-size")
    described = {"outputs": [{"name": o.name, "datatype": o.datatype, "shape": list(o.shape)} for o in response.outputs]}
    ours = DecodedOutputs(read_outputs(regions, described, outputs))
    compare_with_tritonclient(_grpc_client(endpoint), grpcclient, io, tensors, ours, rtol=1e-5, what=f"gRPC {regions.kind} shared-memory")


def _exchange(endpoint: Endpoint, io: ModelIO, request: bytes,
              fix: str = "check --grpc-url and that the evaluation data matches the model's inputs") -> Any:
    """The ``ModelInferResponse`` to one pre-serialized request (a refusal in one line, with ``fix``)."""
    grpc = import_optional("grpc", None, "gRPC load")
    service_pb2 = import_optional("tritonclient.grpc.service_pb2", None, "gRPC load")
    with grpc.insecure_channel(endpoint.address, options=_DIRECT) as channel:
        try:
            raw = channel.unary_unary(_METHOD)(request, timeout=30.0)
        except grpc.RpcError as exc:
            raise PipelineError(
                f"Triton's gRPC endpoint {endpoint.address} rejected the request for '{io.name}' ({exc.code().name}: {exc.details()})", fix,
            ) from None
    return service_pb2.ModelInferResponse.FromString(raw)


def _grpc_client(endpoint: Endpoint) -> Any:
    grpcclient = import_optional("tritonclient.grpc", None, "gRPC load")
    # channel_args replaces tritonclient's own options, so its message size limits are repeated here
    size = grpcclient.MAX_GRPC_MESSAGE_SIZE
    return grpcclient.InferenceServerClient(
        endpoint.address, channel_args=[("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size), *_DIRECT]
    )


class _Target:
    def __init__(self, endpoint: Endpoint, payloads: list[bytes]) -> None:
        self.endpoint = endpoint
        self.payloads = payloads
        self.next_payload = 0
        self.recorder = Recorder()
        self.done_ns: list[int] = []  # latencies from grpcio's threads, moved into the recorder by ours
        self.call: Any = None
        self.channel: Any = None
        self.failures = 0
        self.next_due_ns = 0
        self.gaps: Any = None
        self.unsent = 0


class GrpcEngine:
    """Closed or open loop over one channel per endpoint; same interface as the HTTP engine."""

    def __init__(self, targets: list[tuple[Endpoint, list[bytes]]], policy: Policy, *, timeout_s: float, max_in_flight: int = 256) -> None:
        self._grpc = import_optional("grpc", None, "gRPC load")
        self._targets = [_Target(e, p) for e, p in targets]
        self.recorders = [t.recorder for t in self._targets]
        self._policy = policy
        self._timeout_s = timeout_s
        self._max_in_flight = max_in_flight
        self._lock = threading.Lock()
        self._in_flight: dict[Any, _Target] = {}
        self._retries: list[tuple[int, int, _Target]] = []  # (due, tiebreak, target): closed-loop re-sends
        self._running = False

    @property
    def unsent(self) -> list[int]:
        return [t.unsent for t in self._targets]

    def start(self) -> None:
        self._running = True
        now = time.perf_counter_ns()
        for t in self._targets:
            t.channel = self._grpc.insecure_channel(t.endpoint.address, options=_DIRECT)
            t.call = t.channel.unary_unary(_METHOD)
            if isinstance(self._policy, ClosedLoop):
                for _ in range(self._policy.concurrency):
                    self._send(t, 0)
            else:
                t.gaps = self._policy.gaps_ns()
                t.next_due_ns = now + next(t.gaps)

    def run_until(self, deadline_ns: int) -> None:
        """Send what is due (open loop) and re-send after back-offs until ``deadline_ns``."""
        open_loop = isinstance(self._policy, OpenLoop)
        while True:
            self._collect()
            now = time.perf_counter_ns()
            if now >= deadline_ns:
                return
            wake = min(deadline_ns, now + _TICK_NS)
            if self._running and open_loop:
                for t in self._targets:
                    while t.next_due_ns <= now:
                        if len(self._in_flight) >= self._max_in_flight:
                            t.unsent += 1  # gRPC multiplexes, so beyond the cap a request is dropped — and counted
                        else:
                            self._send(t, t.next_due_ns)
                            t.recorder.lag_ns.append(time.perf_counter_ns() - t.next_due_ns)
                        t.next_due_ns += next(t.gaps)
                    wake = min(wake, t.next_due_ns)
            with self._lock:
                due = [heapq.heappop(self._retries)[2] for _ in range(len(self._retries)) if self._retries[0][0] <= now]
            for t in due:
                if self._running:
                    self._send(t, 0)
            delay = (wake - time.perf_counter_ns()) / 1e9
            if delay > 0:
                time.sleep(delay)

    def finish(self, drain_s: float) -> None:
        self._running = False
        deadline = time.monotonic() + drain_s
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        with self._lock:
            left = list(self._in_flight.items())
            self._in_flight.clear()
        for future, t in left:
            t.recorder.abandoned += 1
            future.cancel()
        self._collect()
        for t in self._targets:
            if t.channel is not None:
                t.channel.close()

    def _collect(self) -> None:
        with self._lock:
            for t in self._targets:
                if t.done_ns:
                    t.recorder.latency_ns.extend(t.done_ns)
                    t.done_ns.clear()

    def _send(self, t: _Target, stamp_ns: int) -> None:
        with self._lock:
            i = t.next_payload
            t.next_payload = i + 1 if i + 1 < len(t.payloads) else 0
            t.recorder.sent += 1
        stamp = stamp_ns or time.perf_counter_ns()
        future = t.call.future(t.payloads[i], timeout=self._timeout_s)
        with self._lock:
            self._in_flight[future] = t
        future.add_done_callback(lambda f: self._done(f, t, stamp))

    def _done(self, future: Any, t: _Target, stamp_ns: int) -> None:
        now = time.perf_counter_ns()
        with self._lock:
            if self._in_flight.pop(future, None) is None:
                return  # abandoned by finish()
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None:
            with self._lock:
                t.done_ns.append(now - stamp_ns)
            t.failures = 0
            if self._running and isinstance(self._policy, ClosedLoop):
                self._send(t, 0)
            return
        code = exc.code() if hasattr(exc, "code") else None
        kind = f"grpc_{code.name.lower()}" if code is not None else type(exc).__name__
        with self._lock:
            t.recorder.error(kind, str(getattr(exc, "details", lambda: exc)()))
            t.failures += 1
            if self._running and isinstance(self._policy, ClosedLoop):
                delay = backoff_ns(t.failures)
                heapq.heappush(self._retries, (now + delay, id(future), t))
