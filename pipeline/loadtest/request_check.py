"""Before the load: prove the pre-encoded request is right, using tritonclient as the reference.

The lean engine never decodes responses. So once per model the very bytes it will send go out
on a plain socket, the response is decoded with tritonclient's parser, and the outputs are
compared with those tritonclient's own client gets for the same tensors. tritonclient is used
only here — at 200-550 µs of CPU per request it would measure itself, not the server.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.lazy import import_optional
from pipeline.loadtest.client import Endpoint, response_frame
from pipeline.loadtest.payload import ModelIO


def raw_exchange(endpoint: Endpoint, request: bytes, timeout: float = 10.0) -> tuple[int, bytes, bytes]:
    """Send one pre-encoded request; return status, head and body of the response."""
    with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("server closed the connection before the response was complete")
            data += chunk
            frame = response_frame(data)
            if frame is not None and len(data) >= frame[1]:
                return int(data[9:12]), data[: frame[0]], data[frame[0] : frame[1]]


def _accepted(endpoint: Endpoint, io: ModelIO, request: bytes, what: str, fix: str) -> tuple[bytes, bytes]:
    """The head and body of Triton's answer to ``request``; one PipelineError if it fails or is refused."""
    try:
        status, head, body = raw_exchange(endpoint, request)
    except OSError as exc:
        raise PipelineError(f"the check request to {endpoint.address} failed ({exc})", "check that the server is up") from None
    if status != 200:
        raise PipelineError(f"Triton rejected the load generator's {what} for model '{io.name}' (HTTP {status}: {body[:300]!r})", fix)
    return head, body


def check_request(endpoint: Endpoint, io: ModelIO, request: bytes, tensors: dict[str, np.ndarray], *, rtol: float = 1e-5) -> None:
    """Raise a PipelineError unless ``request`` gives the outputs tritonclient gets for ``tensors``."""
    httpclient = import_optional("tritonclient.http", None, "checking the load generator's requests")
    head, body = _accepted(endpoint, io, request, "request", "check that the evaluation data matches the model's inputs (names, dtypes, shapes)")
    ours = infer_result(head, body)
    client = httpclient.InferenceServerClient(endpoint.address, network_timeout=30.0, connection_timeout=10.0)
    compare_with_tritonclient(client, httpclient, io, tensors, ours, rtol=rtol, what="HTTP")


def infer_result(head: bytes, body: bytes) -> Any:
    """tritonclient's ``InferResult`` of one HTTP response's head and body (binary tensor data or plain JSON)."""
    httpclient = import_optional("tritonclient.http", None, "decoding Triton's HTTP responses")
    header_length = None
    for line in head.decode("latin-1").split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() == "inference-header-content-length":
            header_length = int(value)
    return httpclient.InferenceServerClient.parse_response_body(body, header_length=header_length)


def compare_with_tritonclient(client: Any, module: Any, io: ModelIO, tensors: dict[str, np.ndarray], ours: Any, *, rtol: float, what: str) -> None:
    """Infer ``tensors`` with tritonclient's own ``client`` (of ``module``: tritonclient.http or .grpc),
    close it, and raise unless ``ours`` (the decoded response to our bytes) has the same outputs."""
    try:
        inputs = []
        for t in io.inputs:
            item = module.InferInput(t.name, list(tensors[t.name].shape), t.datatype)
            item.set_data_from_numpy(tensors[t.name])
            inputs.append(item)
        reference = client.infer(io.name, inputs)
    finally:
        client.close()
    for t in io.outputs:
        want, got = reference.as_numpy(t.name), ours.as_numpy(t.name)
        if got is None or want is None or got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=1e-6):
            raise PipelineError(
                f"{what} output '{t.name}' of model '{io.name}' differs between the load generator's request and tritonclient's",
                "this is a bug in the request encoding; run with --encoding json (or --shared-memory none) to compare",
            )


class DecodedOutputs:
    """Decoded outputs with tritonclient's ``InferResult.as_numpy`` interface."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self._arrays = arrays

    def as_numpy(self, name: str) -> np.ndarray | None:
        return self._arrays.get(name)


def check_shm_request(endpoint: Endpoint, io: ModelIO, request: bytes, tensors: dict[str, np.ndarray], regions: Any, outputs: dict[str, Any]) -> None:
    """Raise unless the shared-memory ``request`` (JSON naming regions of ``regions``) leaves in its
    output regions what tritonclient's plain HTTP request returns for ``tensors``."""
    from pipeline.loadtest.shm import read_outputs

    httpclient = import_optional("tritonclient.http", None, "checking the load generator's requests")
    _, body = _accepted(endpoint, io, request, "shared-memory request", "check --output-shared-memory-size and that the server runs on this machine")
    ours = DecodedOutputs(read_outputs(regions, json.loads(body), outputs))
    client = httpclient.InferenceServerClient(endpoint.address, network_timeout=30.0, connection_timeout=10.0)
    compare_with_tritonclient(client, httpclient, io, tensors, ours, rtol=1e-5, what=f"{regions.kind} shared-memory")
