"""Shared-memory transport for the load generator, as perf_analyzer's ``--shared-memory system|cuda``.

Before the load, every distinct request's input tensors are written once into a region of their own
(system: a POSIX shared-memory object under ``/dev/shm``; cuda: device memory shared by a CUDA IPC
handle, through ``tritonclient.utils.cuda_shared_memory``) and each output gets one region of
``--output-shared-memory-size`` bytes. The regions are registered with every endpoint through
Triton's shared-memory extension (``/v2/systemsharedmemory``, ``/v2/cudasharedmemory``), and the
requests then carry only a small JSON body (gRPC: a ``ModelInferRequest`` without contents) naming
region, offset and size per tensor: the tensor bytes never cross the socket. Concurrent requests
write the same output regions, as perf_analyzer's do; the load never reads them, and the one check
request before the load runs alone.

Regions are unregistered and unlinked when the :class:`SharedMemoryRegions` context exits, which
includes Ctrl-C (``KeyboardInterrupt`` unwinds through it). The server must see this host's
``/dev/shm`` (system) or GPU (cuda): shared memory works on one machine only.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np

from pipeline.core.errors import PipelineError
from pipeline.core.lazy import import_optional
from pipeline.loadtest.client import Endpoint, request_json
from pipeline.loadtest.payload import NUMPY_OF, ModelIO, TensorInfo, tensor_bytes

log = logging.getLogger(__name__)

SHARED_MEMORY = ("none", "system", "cuda")
# Every region this package creates starts with this: a leftover is recognisable in /dev/shm.
REGION_PREFIX = "pipeline_loadtest_"
_API = {"system": "/v2/systemsharedmemory", "cuda": "/v2/cudasharedmemory"}


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives: a registered region, the offset into it and its byte size."""

    region: str
    offset: int
    byte_size: int

    def parameters(self) -> dict[str, Any]:
        """The tensor's ``parameters`` in a KServe v2 request (Triton's shared-memory extension)."""
        params: dict[str, Any] = {"shared_memory_region": self.region, "shared_memory_byte_size": self.byte_size}
        if self.offset:
            params["shared_memory_offset"] = self.offset
        return params


class SharedMemoryRegions:
    """Regions of one kind, created here and registered with ``endpoints``; a context manager that
    unregisters and destroys every region on exit (also on an exception or Ctrl-C)."""

    def __init__(self, kind: str, endpoints: list[Endpoint], device_id: int = 0) -> None:
        if kind not in _API:
            raise PipelineError(f"unknown --shared-memory '{kind}'", f"use one of: {', '.join(SHARED_MEMORY)}")
        self.kind = kind
        self.endpoints = list(endpoints)
        self.device_id = device_id
        self.tag = f"{REGION_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self._handles: dict[str, Any] = {}
        self._sizes: dict[str, int] = {}
        self._registered: list[tuple[Endpoint, str]] = []
        self._module = (
            import_optional("tritonclient.utils.shared_memory", None, "--shared-memory system")
            if kind == "system"
            else import_optional("tritonclient.utils.cuda_shared_memory", None, "--shared-memory cuda (needs cuda-python and a GPU)")
        )

    def __enter__(self) -> SharedMemoryRegions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self, suffix: str, arrays: list[np.ndarray] | None, byte_size: int) -> str:
        """A new region of ``byte_size`` bytes holding ``arrays`` back to back, registered with every
        endpoint; returns its name (also its key, for system memory)."""
        name = f"{self.tag}{suffix}"
        try:
            if self.kind == "system":
                handle = self._module.create_shared_memory_region(name, f"/{name}", byte_size, create_only=True)
            else:
                handle = self._module.create_shared_memory_region(name, byte_size, self.device_id)
        except Exception as exc:  # tritonclient's own exception types, or CUDA's
            raise PipelineError(f"cannot create {self.kind} shared memory of {byte_size} bytes ({exc})",
                                "free /dev/shm space (df -h /dev/shm) or use --shared-memory none") from None
        self._handles[name] = handle
        self._sizes[name] = byte_size
        if arrays:
            self._module.set_shared_memory_region(handle, [np.ascontiguousarray(a) for a in arrays])
        for endpoint in self.endpoints:
            self._register(endpoint, name, handle, byte_size)
        return name

    def ensure_registered(self) -> bool:
        """Register again what a restarted server lost (its registrations die with its process); True
        once every endpoint holds every region, False while one cannot be reached or refuses."""
        try:
            for endpoint in self.endpoints:
                missing = set(self._handles) - set(registered_regions(endpoint, self.kind))
                for name in sorted(missing):
                    self._register(endpoint, name, self._handles[name], self._sizes[name])
        except (OSError, PipelineError) as exc:
            log.debug("shared memory not registered again yet: %s", exc)
            return False
        return True

    def read(self, region: str, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A copy of a tensor in one of these regions."""
        handle = self._handles[region]
        if self.kind == "system":
            return np.array(self._module.get_contents_as_numpy(handle, dtype, list(shape), offset=offset))
        return np.array(self._module.get_contents_as_numpy(handle, dtype, list(shape)))

    def _register(self, endpoint: Endpoint, name: str, handle: Any, byte_size: int) -> None:
        if self.kind == "system":
            body: dict[str, Any] = {"key": f"/{name}", "offset": 0, "byte_size": byte_size}
        else:
            raw = self._module.get_raw_handle(handle)
            body = {"raw_handle": {"b64": raw.decode() if isinstance(raw, bytes) else str(raw)},
                    "device_id": self.device_id, "byte_size": byte_size}
        path = f"{_API[self.kind]}/region/{quote(name)}/register"
        # Recorded before asking: a Ctrl-C that lands while the server registers it must still unregister it
        # (unregistering a name the server does not hold is harmless).
        self._registered.append((endpoint, name))
        try:
            status, answer = request_json(endpoint, "POST", path, body, timeout=10.0)
        except OSError as exc:
            raise PipelineError(f"cannot register shared memory with {endpoint.address} ({exc})", "check that the server is up") from None
        if status != 200:
            raise PipelineError(
                f"Triton at {endpoint.address} refused to register {self.kind} shared memory (HTTP {status}: {json.dumps(answer)[:200]})",
                "the server must run on this machine (shared memory is local) and its shared-memory API must not be "
                "restricted; otherwise use --shared-memory none",
            )

    def close(self) -> None:
        """Unregister every region from every endpoint (best effort: a dead server holds none), then
        unmap and unlink them here."""
        registered, self._registered = self._registered, []
        for endpoint, name in registered:
            try:
                request_json(endpoint, "POST", f"{_API[self.kind]}/region/{quote(name)}/unregister", timeout=5.0)
            except OSError as exc:
                log.debug("unregistering %s from %s: %s", name, endpoint.address, exc)
        handles, self._handles = self._handles, {}
        for name, handle in handles.items():
            try:
                self._module.destroy_shared_memory_region(handle)
            except Exception as exc:  # keep destroying the others
                log.warning("could not remove shared memory region %s: %s", name, exc)


def registered_regions(endpoint: Endpoint, kind: str) -> list[str]:
    """The names of the regions ``endpoint`` has registered (Triton's shared-memory status API)."""
    status, answer = request_json(endpoint, "GET", f"{_API[kind]}/status")
    if status != 200 or not isinstance(answer, list):
        raise PipelineError(f"Triton at {endpoint.address} gave no shared-memory status (HTTP {status})", "check the server")
    return [str(entry.get("name")) for entry in answer]


def output_byte_sizes(io: ModelIO, batch_size: int, given: int | None) -> dict[str, int]:
    """Bytes per output region: ``given`` (``--output-shared-memory-size``) for each, else the size
    the model's static output shape takes at ``batch_size``."""
    sizes = {}
    for t in io.outputs:
        if given is not None:
            sizes[t.name] = given
            continue
        if any(d < 0 for d in t.shape) or t.datatype not in NUMPY_OF:
            raise PipelineError(
                f"output '{t.name}' of model '{io.name}' has no fixed size ({t.datatype} {list(t.shape)})",
                "pass --output-shared-memory-size BYTES, as large as one response's biggest output",
            )
        rows = batch_size if io.max_batch_size > 0 else 1
        sizes[t.name] = int(np.prod(t.shape, dtype=np.int64)) * rows * np.dtype(NUMPY_OF[t.datatype]).itemsize
    return sizes


@dataclass(frozen=True)
class ShmRequests:
    """One model's requests over shared memory: the HTTP bodies, where each batch's inputs lie (for a gRPC
    request naming the same slots) and where its outputs land."""

    bodies: list[bytes]
    outputs: dict[str, Slot]
    inputs: list[dict[str, Slot]]


def shm_requests(io: ModelIO, batches: list[dict[str, np.ndarray]], regions: SharedMemoryRegions, output_sizes: dict[str, int]) -> ShmRequests:
    """Write every batch's inputs into a region of its own and give each output a region; the JSON
    bodies that name them."""
    outputs = {t.name: Slot(regions.create(f"out{k}", None, output_sizes[t.name]), 0, output_sizes[t.name])
               for k, t in enumerate(io.outputs)}
    bodies, inputs = [], []
    for n, batch in enumerate(batches):
        # BYTES (object arrays: files, sentences) go in serialized, as Triton reads them: each element's length, then it
        arrays = [np.frombuffer(tensor_bytes(batch[t.name]), np.uint8) if batch[t.name].dtype == object
                  else np.ascontiguousarray(batch[t.name], dtype=batch[t.name].dtype.newbyteorder("<")) for t in io.inputs]
        region = regions.create(f"in{n}", arrays, sum(a.nbytes for a in arrays))
        slots, offset = {}, 0
        for t, array in zip(io.inputs, arrays, strict=True):
            slots[t.name] = Slot(region, offset, array.nbytes)
            offset += array.nbytes
        bodies.append(encode_shm(io, batch, slots, outputs))
        inputs.append(slots)
    return ShmRequests(bodies, outputs, inputs)


def encode_shm(io: ModelIO, tensors: dict[str, np.ndarray], inputs: dict[str, Slot], outputs: dict[str, Slot]) -> bytes:
    """A KServe v2 JSON request whose inputs and outputs are shared-memory slots (no tensor data)."""
    body = {
        "inputs": [{"name": t.name, "shape": list(tensors[t.name].shape), "datatype": t.datatype, "parameters": inputs[t.name].parameters()}
                   for t in io.inputs],
        "outputs": [{"name": t.name, "parameters": outputs[t.name].parameters()} for t in io.outputs],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def read_outputs(regions: SharedMemoryRegions, response: dict[str, Any], outputs: dict[str, Slot]) -> dict[str, np.ndarray]:
    """The outputs a shared-memory response describes (shape and datatype from its JSON), read from
    their regions."""
    got = {}
    for entry in response.get("outputs", []):
        info = TensorInfo(entry["name"], entry["datatype"], tuple(entry["shape"]))
        slot = outputs[info.name]
        got[info.name] = regions.read(slot.region, slot.offset, np.dtype(NUMPY_OF[info.datatype]), info.shape)
    return got
