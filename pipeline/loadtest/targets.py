"""What to load: is the server there, which models are ready, what do they take.

Every failure here is a user error with a fix, raised before any load starts — an unreachable
URL fails in about a second, not after a sweep of timeouts.
"""

from __future__ import annotations

from urllib.parse import quote

from pipeline.core.errors import PipelineError
from pipeline.loadtest.client import Endpoint, request_json
from pipeline.loadtest.payload import ModelIO, TensorInfo

_PROBE_TIMEOUT_S = 3.0


def _call(endpoint: Endpoint, method: str, path: str, body: object | None = None) -> tuple[int, object]:
    try:
        return request_json(endpoint, method, path, body, timeout=_PROBE_TIMEOUT_S)
    except OSError as exc:
        raise PipelineError(
            f"cannot reach Triton at {endpoint.address} ({exc.strerror or exc})",
            "start it (python -m pipeline serve) and pass its HTTP address with --url, "
            "or omit --url to let loadtest start the embedded server",
        ) from None


def server_metadata(endpoint: Endpoint) -> dict:
    """The server's name, version and extensions; raises when it is unreachable or not live.

    Liveness, not readiness: with ``--strict-readiness`` one failed model makes the whole server
    "not ready", yet its other models serve — each model's own readiness is checked instead."""
    status, _ = _call(endpoint, "GET", "/v2/health/live")
    if status != 200:
        raise PipelineError(
            f"Triton at {endpoint.address} answers but is not live (HTTP {status})",
            "check the server's log; it may be shutting down",
        )
    status, meta = _call(endpoint, "GET", "/v2")
    return meta if status == 200 and isinstance(meta, dict) else {}


def ready_models(endpoint: Endpoint) -> list[str]:
    """Names of the models the server reports READY (repository index)."""
    status, index = _call(endpoint, "POST", "/v2/repository/index", {})
    if status != 200 or not isinstance(index, list):
        raise PipelineError(
            f"Triton at {endpoint.address} did not list its models (HTTP {status})", "name the models with --model"
        )
    return sorted({entry["name"] for entry in index if entry.get("state") == "READY"})


def require_ready(endpoint: Endpoint, model: str) -> None:
    """Raise unless ``model`` is ready on ``endpoint``, naming the models that are."""
    status, _ = _call(endpoint, "GET", f"/v2/models/{quote(model, safe='')}/ready")
    if status != 200:
        try:
            ready = ", ".join(ready_models(endpoint)) or "none"
        except PipelineError:
            ready = "unknown"
        raise PipelineError(
            f"model '{model}' is not ready on Triton at {endpoint.address} (ready: {ready})",
            "pass a ready model with --model, or check the server log for why it failed to load",
        )


def model_io(endpoint: Endpoint, model: str) -> ModelIO:
    """Inputs, outputs and max_batch_size of a ready model (metadata + configuration extensions)."""
    require_ready(endpoint, model)
    name = quote(model, safe="")
    status, meta = _call(endpoint, "GET", f"/v2/models/{name}")
    if status != 200 or not isinstance(meta, dict):
        raise PipelineError(f"Triton did not describe model '{model}' (HTTP {status}: {meta})", "check the server log")
    status, config = _call(endpoint, "GET", f"/v2/models/{name}/config")
    max_batch = int(config.get("max_batch_size", 0)) if status == 200 and isinstance(config, dict) else 0
    return model_io_from_metadata(model, meta, max_batch)


def model_io_from_metadata(model: str, meta: dict, max_batch: int) -> ModelIO:
    """:class:`ModelIO` from Triton's model metadata (``GET /v2/models/<model>``) and the max batch size."""

    def tensors(key: str) -> tuple[TensorInfo, ...]:
        out = []
        for t in meta.get(key, []):
            shape = tuple(int(d) for d in t.get("shape", []))
            # Metadata shapes include the batch axis (-1) of a batching model; the config's dims do not.
            out.append(TensorInfo(t["name"], t["datatype"], shape[1:] if max_batch > 0 else shape))
        return tuple(out)

    return ModelIO(model, tensors("inputs"), tensors("outputs"), max_batch)
