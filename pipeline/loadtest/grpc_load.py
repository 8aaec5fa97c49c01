"""gRPC load: ``grpc.aio`` with requests serialized once (a ``ModelInferRequest`` as bytes).

This is leaner than tritonclient's gRPC client (no protobuf building per request, no response
decoding) but still pays grpcio's per-call cost and HTTP/2 framing — expect several times the
HTTP engine's client CPU per request; the report shows the measured figure, so compare
protocols with that in mind. All requests to one endpoint share one channel (HTTP/2
multiplexing), as gRPC clients normally do.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from pipeline._lazy import import_optional
from pipeline.errors import PipelineError
from pipeline.loadtest.client import Endpoint
from pipeline.loadtest.payload import ModelIO
from pipeline.loadtest.policy import ClosedLoop, OpenLoop, Policy
from pipeline.loadtest.recorder import Recorder

_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def grpc_request_bytes(io: ModelIO, tensors: dict[str, np.ndarray]) -> bytes:
    """A serialized ``ModelInferRequest`` with the tensors as raw little-endian contents."""
    service_pb2 = import_optional("tritonclient.grpc.service_pb2", "all", "gRPC load")
    request = service_pb2.ModelInferRequest(model_name=io.name)
    for t in io.inputs:
        array = tensors[t.name]
        request.inputs.add(name=t.name, datatype=t.datatype, shape=list(array.shape))
        request.raw_input_contents.append(array.astype(array.dtype.newbyteorder("<")).tobytes())
    for t in io.outputs:
        request.outputs.add(name=t.name)
    return request.SerializeToString()


def check_grpc_request(endpoint: Endpoint, io: ModelIO, request: bytes, tensors: dict[str, np.ndarray]) -> None:
    """Raise unless the pre-serialized request gives the outputs tritonclient's gRPC client gets."""
    grpc = import_optional("grpc", "all", "gRPC load")
    grpcclient = import_optional("tritonclient.grpc", "all", "gRPC load")
    service_pb2 = import_optional("tritonclient.grpc.service_pb2", "all", "gRPC load")
    with grpc.insecure_channel(endpoint.address) as channel:
        call = channel.unary_unary(_METHOD)
        try:
            raw = call(request, timeout=30.0)
        except grpc.RpcError as exc:
            raise PipelineError(
                f"Triton's gRPC endpoint {endpoint.address} rejected the request for '{io.name}' ({exc.code().name}: {exc.details()})",
                "check --grpc-url and that the evaluation data matches the model's inputs",
            ) from None
    response = service_pb2.ModelInferResponse.FromString(raw)
    ours = grpcclient.InferResult(response)
    client = grpcclient.InferenceServerClient(endpoint.address)
    try:
        inputs = []
        for t in io.inputs:
            item = grpcclient.InferInput(t.name, list(tensors[t.name].shape), t.datatype)
            item.set_data_from_numpy(tensors[t.name])
            inputs.append(item)
        reference = client.infer(io.name, inputs)
    finally:
        client.close()
    for t in io.outputs:
        want, got = reference.as_numpy(t.name), ours.as_numpy(t.name)
        if got is None or want is None or got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            raise PipelineError(
                f"gRPC output '{t.name}' of model '{io.name}' differs from tritonclient's", "this is a bug in the request encoding"
            )


class GrpcEngine:
    """Closed or open loop over one ``grpc.aio`` channel per endpoint; same interface as the HTTP engine."""

    def __init__(self, targets: list[tuple[Endpoint, list[bytes]]], policy: Policy, *, timeout_s: float, max_in_flight: int = 256) -> None:
        self._grpc = import_optional("grpc", "all", "gRPC load")
        self._targets = targets
        self._policy = policy
        self._timeout_s = timeout_s
        self._max_in_flight = max_in_flight
        self.recorders = [Recorder() for _ in targets]
        self._unsent = [0] * len(targets)
        self._loop = asyncio.new_event_loop()
        self._running = False
        self._tasks: set[asyncio.Task] = set()
        self._channels: list[Any] = []
        self._in_flight = [0] * len(targets)

    @property
    def unsent(self) -> list[int]:
        return list(self._unsent)

    def start(self) -> None:
        self._running = True
        self._loop.run_until_complete(self._open())

    async def _open(self) -> None:
        for i, (endpoint, payloads) in enumerate(self._targets):
            channel = self._grpc.aio.insecure_channel(endpoint.address)
            self._channels.append(channel)
            call = channel.unary_unary(_METHOD)
            if isinstance(self._policy, ClosedLoop):
                for slot in range(self._policy.concurrency):
                    self._spawn(self._closed(i, call, payloads, slot))
            else:
                self._spawn(self._open_loop(i, call, payloads, self._policy))

    def run_until(self, deadline_ns: int) -> None:
        delay = (deadline_ns - time.perf_counter_ns()) / 1e9
        if delay > 0:
            self._loop.run_until_complete(asyncio.sleep(delay))

    def finish(self, drain_s: float) -> None:
        self._running = False

        async def drain() -> None:
            deadline = time.monotonic() + drain_s
            while sum(self._in_flight) and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for channel in self._channels:
                await channel.close()

        self._loop.run_until_complete(drain())
        self._loop.close()

    async def _one(self, i: int, call: Any, payload: bytes, stamp_ns: int) -> None:
        recorder = self.recorders[i]
        recorder.sent += 1
        self._in_flight[i] += 1
        try:
            await call(payload, timeout=self._timeout_s)
        except self._grpc.aio.AioRpcError as exc:
            recorder.error(f"grpc_{exc.code().name.lower()}", str(exc.details()))
        except asyncio.CancelledError:
            recorder.abandoned += 1
            raise
        else:
            recorder.latency_ns.append(time.perf_counter_ns() - stamp_ns)
        finally:
            self._in_flight[i] -= 1

    async def _closed(self, i: int, call: Any, payloads: list[bytes], slot: int) -> None:
        k = slot
        failures = 0
        while self._running:
            errors = self.recorders[i].error_count
            await self._one(i, call, payloads[k % len(payloads)], time.perf_counter_ns())
            k += 1
            if self.recorders[i].error_count > errors:  # back off while the server fails
                failures += 1
                await asyncio.sleep(min(0.5, 0.01 * 2 ** min(failures, 6)))
            else:
                failures = 0

    async def _open_loop(self, i: int, call: Any, payloads: list[bytes], policy: OpenLoop) -> None:
        gaps = policy.gaps_ns()
        due = time.perf_counter_ns() + next(gaps)
        k = 0
        lag = self.recorders[i].lag_ns
        while self._running:
            wait = (due - time.perf_counter_ns()) / 1e9
            if wait > 0:
                await asyncio.sleep(wait)
            if not self._running:
                break
            if self._in_flight[i] >= self._max_in_flight:
                self._unsent[i] += 1  # gRPC multiplexes; beyond the cap a request is dropped, and counted
            else:
                lag.append(time.perf_counter_ns() - due)
                self._spawn(self._one(i, call, payloads[k % len(payloads)], due))
                k += 1
            due += next(gaps)

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
