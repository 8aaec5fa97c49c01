"""Turning a tritonserver log into one-line errors: which model failed and why, which port was taken."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.core.errors import PipelineError

_FAILED_LOAD = re.compile(r"failed to load '([^']+)' version \d+: (.*?)\"?$")
class PortInUseError(PipelineError):
    """tritonserver could not bind a port: another process holds it."""


_PORT_IN_USE = re.compile(r"failed to start (\w+) service: .*Socket '([^']+)' already in use")
_NO_GPU_NOISE = ("CudaDriverHelper", "NVML", "DCGM")  # expected on a machine without a GPU


def log_lines(log_path: Path | None) -> list[str]:
    """The log's lines (none if it is missing)."""
    try:
        return log_path.read_text(errors="replace").splitlines() if log_path else []
    except OSError:
        return []


def last_errors(log_path: Path | None, limit: int = 3) -> str:
    """The last error lines (or, if none, the last lines), joined on one line."""
    lines = log_lines(log_path)
    errors = [line.strip() for line in lines if line.startswith("E") or line.lower().startswith("error")]
    errors = [line for line in errors if not any(word in line for word in _NO_GPU_NOISE)]
    tail = errors[-limit:] or [line.strip() for line in lines[-limit:]]
    return " | ".join(tail) or "(empty log)"


def _one_line(cause: str, replace: dict[str, str]) -> str:
    # The log escapes newlines; what follows the first is the Python stack of the backend.
    cause = cause.split("\\n", 1)[0].replace("TritonModelException: ", "").strip()
    for old, new in replace.items():
        cause = cause.replace(old, new)
    return cause


def startup_error(log_path: Path | None, exit_code: int, replace: dict[str, str]) -> PipelineError:
    """Why tritonserver exited during startup, as a PipelineError; ``replace`` rewrites private paths."""
    lines = log_lines(log_path)
    failed: dict[str, str] = {}
    for line in lines:
        match = _FAILED_LOAD.search(line)
        if match:
            failed.setdefault(match.group(1), _one_line(match.group(2), replace))
    if failed:
        detail = "; ".join(f"model '{name}' failed to load: {why}" for name, why in failed.items())
        if any("KIND_GPU" in why for why in failed.values()):
            # The config is fine; the GPU it asks for is not visible to this server.
            return PipelineError(
                f"tritonserver could not start: {detail}",
                f"check that the GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES) — full log: {log_path}",
            )
        return PipelineError(
            f"tritonserver could not start: {detail}",
            f"fix or rebuild the model(s) (python -m pipeline build) — full log: {log_path}",
        )
    in_use = next((m for m in map(_PORT_IN_USE.search, lines) if m), None)
    if in_use:
        service, address = in_use.groups()
        return PortInUseError(
            f"tritonserver could not start its {service} service: {address} is already in use",
            "another process took the port meanwhile; retry, or choose ports with --http-port/--grpc-port/--metrics-port",
        )
    return PipelineError(
        f"tritonserver exited with code {exit_code} during startup: {last_errors(log_path)}",
        f"see the full log: {log_path}",
    )
