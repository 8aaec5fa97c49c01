"""Where trials run: the embedded tritonserver (pinned to ``--cores``) or a remote Triton (``--url``).

Both are Tritons in explicit model-control mode; a candidate is loaded through the repository
API's load request with a config override (``{"parameters": {"config": "<json>"}}``), which
reloads the model in place (well under a second here) and never touches the model files. A
failed load leaves the previous config serving (Triton keeps the loaded version), so one bad
candidate costs one trial, not the run. Where the server exports GPU memory gauges, each trial
unloads the model first to read the memory without it (:mod:`pipeline.tune.gpu_memory`); a
failed load then leaves the model unloaded until the next trial loads its candidate. The admin key, when the repository API is restricted
(as in the production launch scripts), comes from ``$TRITON_ADMIN_KEY``.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pipeline.core.errors import PipelineError, require
from pipeline.loadtest.client import Endpoint, endpoint_from_url
from pipeline.loadtest.metrics import default_metrics_endpoint
from pipeline.loadtest.payload import ModelIO
from pipeline.loadtest.targets import model_io_from_metadata
from pipeline.triton.server_args import ADMIN_HEADER, ADMIN_KEY_ENV
from pipeline.tune.gpu_memory import EMBEDDED_REFRESH_MS, TRITON_DEFAULT_REFRESH_MS

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

_PROBE_MODEL = "__pipeline_tune_probe__"  # unloading a model that does not exist changes nothing
_LOADED_STATES = ("READY", "LOADING", "UNLOADING")  # of the repository index: the model's instances may still hold memory
UNLOAD_TIMEOUT_S = 60.0


class LoadRejected(Exception):
    """The server refused a candidate config (it keeps serving the previous one)."""


class Target:
    """A Triton in explicit model-control mode reachable over HTTP (``metrics``: its /metrics address,
    None: Triton's default layout, the HTTP port + 2; ``metrics_refresh_s``: how often it refreshes its
    gauges, Triton's default unless known)."""

    def __init__(self, endpoint: Endpoint, admin_key: str | None, identity: dict[str, Any], metrics: Endpoint | None = None,
                 metrics_refresh_s: float = TRITON_DEFAULT_REFRESH_MS / 1000) -> None:
        self.endpoint = endpoint
        self.admin_key = admin_key
        self.identity = identity
        self.metrics = metrics
        self.metrics_refresh_s = metrics_refresh_s

    @property
    def metrics_endpoint(self) -> Endpoint:
        """Where the server's Prometheus metrics are."""
        return self.metrics or default_metrics_endpoint(self.endpoint)

    # -- control plane ---------------------------------------------------------------------------
    def call(self, method: str, path: str, body: object | None = None, timeout: float = 120.0) -> tuple[int, Any]:
        """One control-plane request (with the admin key when there is one); OSError → PipelineError."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if self.admin_key:
            headers[ADMIN_HEADER] = self.admin_key
        conn = http.client.HTTPConnection(self.endpoint.host, self.endpoint.port, timeout=timeout)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise PipelineError(f"cannot reach Triton at {self.endpoint.address} ({exc})",
                                "start it in explicit mode (python -m pipeline serve --model-control explicit) "
                                "and pass its HTTP address with --url, or omit --url for the embedded server") from None
        finally:
            conn.close()
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, raw.decode("utf-8", "replace")

    def check_explicit(self) -> None:
        """Raise unless the server is live, in explicit mode, and its repository API accepts us."""
        status, _ = self.call("GET", "/v2/health/live", timeout=5)
        require(status == 200, f"Triton at {self.endpoint.address} is not live (HTTP {status})", "check its log")
        status, body = self.call("POST", f"/v2/repository/models/{_PROBE_MODEL}/unload", {}, timeout=10)
        self._raise_for(status, body)

    def _raise_for(self, status: int, body: Any) -> None:
        message = body.get("error", "") if isinstance(body, dict) else str(body or "")
        if status == 403 or "restricted" in message:
            if self.admin_key:
                raise PipelineError(f"Triton at {self.endpoint.address} rejects the admin key in ${ADMIN_KEY_ENV} ({message})",
                                    f"set ${ADMIN_KEY_ENV} to the key the server was started with")
            raise PipelineError(f"the repository API of Triton at {self.endpoint.address} is restricted ({message})",
                                f"export {ADMIN_KEY_ENV}=<the server's admin key> and run tune again")
        if "not allowed" in message or "explicit" in message:
            raise PipelineError(f"Triton at {self.endpoint.address} is not in explicit model-control mode ({message})",
                                "restart it with --model-control-mode=explicit (python -m pipeline serve --model-control explicit)")
        if status != 200:
            raise PipelineError(f"Triton at {self.endpoint.address} answered HTTP {status}: {message}", "check its log")

    def model_config(self, model: str) -> ModelConfig:
        """The config the server runs for ``model`` now."""
        from pipeline.tune.space import config_from_json

        status, body = self.call("GET", f"/v2/models/{quote(model, safe='')}/config", timeout=10)
        if status == 404 or (status == 400 and "unknown model" in str(body).lower()):
            raise PipelineError(f"model '{model}' is not served by Triton at {self.endpoint.address}",
                                "pass a model the server has (or build it: python -m pipeline build)")
        if status != 200:
            self._raise_for(status, body)
        return config_from_json(body)

    def model_io(self, model: str, max_batch: int) -> ModelIO:
        """Inputs and outputs of ``model`` (metadata extension; not restricted)."""
        status, meta = self.call("GET", f"/v2/models/{quote(model, safe='')}", timeout=10)
        require(status == 200 and isinstance(meta, dict), f"Triton did not describe model '{model}' (HTTP {status}: {meta})",
                "check that the model is loaded")

        return model_io_from_metadata(model, meta, max_batch)

    def load(self, model: str, config: ModelConfig) -> float:
        """Load ``config`` for ``model`` through the repository API; seconds it took. Raises
        LoadRejected when the server refuses the config, PipelineError for access problems."""
        from pipeline.tune.space import config_json

        began = time.perf_counter()
        status, body = self.call("POST", f"/v2/repository/models/{quote(model, safe='')}/load",
                                 {"parameters": {"config": config_json(config)}})
        if status == 400 and isinstance(body, dict) and "load failed" in body.get("error", ""):
            raise LoadRejected(body["error"].splitlines()[0])
        self._raise_for(status, body)
        status, _ = self.call("GET", f"/v2/models/{quote(model, safe='')}/ready", timeout=10)
        if status != 200:
            raise LoadRejected(f"model '{model}' is not ready after loading the candidate (HTTP {status})")
        return time.perf_counter() - began

    def unload(self, model: str) -> None:
        """Unload ``model`` and wait (at most UNLOAD_TIMEOUT_S) until the repository index no longer
        lists it loaded, loading or unloading: its instances are gone (the unload request itself
        returns before they are)."""
        status, body = self.call("POST", f"/v2/repository/models/{quote(model, safe='')}/unload", {})
        self._raise_for(status, body)
        deadline = time.monotonic() + UNLOAD_TIMEOUT_S
        while True:
            status, index = self.call("POST", "/v2/repository/index", {}, timeout=10)
            self._raise_for(status, index)
            states = {e.get("state") for e in index if isinstance(e, dict) and e.get("name") == model} if isinstance(index, list) else set()
            if not states & set(_LOADED_STATES):
                return
            if time.monotonic() > deadline:
                raise PipelineError(f"Triton at {self.endpoint.address} did not unload '{model}' in {UNLOAD_TIMEOUT_S:g} s "
                                    f"(state {', '.join(sorted(map(str, states)))})", "check its log")
            time.sleep(0.05)

    def close(self) -> None:
        """Release what the target holds (the embedded server stops)."""


def remote_target(url: str, metrics_url: str | None = None) -> Target:
    """A running Triton at ``url``; its repository API must be in explicit mode (checked)."""
    endpoint = endpoint_from_url(url)
    key = os.environ.get(ADMIN_KEY_ENV) or None
    target = Target(endpoint, key, {}, endpoint_from_url(metrics_url) if metrics_url else None)
    target.check_explicit()
    _, meta = target.call("GET", "/v2", timeout=5)
    meta = meta if isinstance(meta, dict) else {}
    target.identity = {"kind": "remote", "url": endpoint.address, "server": meta.get("name"), "version": meta.get("version")}
    return target


class EmbeddedTarget(Target):
    """The embedded tritonserver in explicit mode, pinned to ``cores`` CPUs, started on first use
    (a tune answered from the cache never starts it). This thread (the load generator) moves to
    the other CPUs while the server runs, and back on :meth:`close`."""

    def __init__(self, repository: Path, cores: int, log_path: Path | None = None, workdir: Path = Path("build")) -> None:
        from pipeline.triton.server import TritonServer

        allowed = sorted(os.sched_getaffinity(0))
        require(1 <= cores <= len(allowed), f"--cores {cores} is not possible: this process may use {len(allowed)} CPUs",
                f"use --cores 1 to {len(allowed)}")
        self.server_cpus = allowed[:cores]
        self.client_cpus = allowed[cores:] or allowed
        self._previous = allowed
        self.server = TritonServer(repository, cpus=self.server_cpus, model_control="explicit", log_path=log_path, workdir=workdir,
                                   metrics_interval_ms=EMBEDDED_REFRESH_MS)
        self._started = False
        identity = {"kind": "embedded", "cores": cores, "cpu": _cpu_model(), "machine": platform.machine(),
                    "tritonserver": _pytriton_version()}
        super().__init__(Endpoint("127.0.0.1", 0), None, identity, metrics_refresh_s=EMBEDDED_REFRESH_MS / 1000)

    def call(self, method: str, path: str, body: object | None = None, timeout: float = 120.0) -> tuple[int, Any]:
        """Start the server on first use, then as :meth:`Target.call`."""
        if not self._started:
            if self.client_cpus == self.server_cpus:
                log.info("the server and the load generator share CPUs %s (pass --cores N below that to give the "
                         "generator its own)", self.server_cpus)
            self._started = True
            self.server.start()
            self.endpoint = endpoint_from_url(self.server.http_url)
            self.metrics = endpoint_from_url(self.server.metrics_url)
            os.sched_setaffinity(0, self.client_cpus)
        return super().call(method, path, body, timeout)

    def close(self) -> None:
        """Stop the server and give this thread its CPUs back."""
        if self._started:
            os.sched_setaffinity(0, self._previous)
            self.server.stop()


def _pytriton_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-pytriton")
    except PackageNotFoundError:
        return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
