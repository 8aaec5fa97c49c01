"""The one place that turns "how should tritonserver run" into its command line.

Used by the CPU rehearsal (:mod:`pipeline.triton.server`), the production bundle
(:mod:`pipeline.triton.deploy`) and the MIG launch bundle (:mod:`pipeline.mig.bundle`), so the
three cannot drift apart: the same readiness, error and config-completion rules everywhere, and the
same admin-API restriction.

Flags as ``tritonserver --help`` of Triton 2.51 spells them. The admin APIs (model-repository,
model-config, shared-memory, trace, logging) are restricted with ``--http-restricted-api`` and
``--grpc-restricted-protocol`` (there is no ``--grpc-restricted-api``), both
``<api>,<api>,...:<header>=<value>`` (docs: inference_protocols.md, "Limit Endpoint Access"). The
key itself is never written: ``admin_key`` is how the deployment refers to it (``${TRITON_ADMIN_KEY}``
for a shell, ``$(TRITON_ADMIN_KEY)`` in a Kubernetes ``args`` list), expanded only where the server starts.

Triton 2.51 takes the key only on its command line (no config file, environment variable or key
file), so a running server's key is readable in ``/proc/<pid>/cmdline`` by whoever may see the
process; what we log of a command line goes through :func:`redacted` first.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.core.errors import require

RESTRICTED_APIS = ("model-repository", "model-config", "shared-memory", "trace", "logging")
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
ADMIN_HEADER = "admin-key"
SHELL_ADMIN_KEY = f"${{{ADMIN_KEY_ENV}}}"  # a shell expands it when the server starts
K8S_ADMIN_KEY = f"$({ADMIN_KEY_ENV})"  # Kubernetes expands $(VAR) in args from the container's env
MODEL_CONTROL_MODES = ("none", "explicit", "poll")


RESTRICTED_FLAGS = ("--http-restricted-api=", "--grpc-restricted-protocol=")


def restricted_api_args(admin_key: str = SHELL_ADMIN_KEY) -> list[str]:
    """Flags that put the admin APIs behind the ``admin-key`` header whose value is ``admin_key``."""
    restricted = f"{','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={admin_key}"
    return [flag + restricted for flag in RESTRICTED_FLAGS]


def redacted(args: Sequence[str]) -> str:
    """``args`` as one line for a log, with the admin key of the restricted-API flags replaced by ``***``."""
    marker = f":{ADMIN_HEADER}="
    shown = [a.split(marker, 1)[0] + marker + "***" if a.startswith(RESTRICTED_FLAGS) and marker in a else a for a in args]
    return " ".join(shown)


@dataclass(frozen=True)
class ServerArgs:
    """How one tritonserver runs. Ports and paths are strings too, so scripts can pass ``$http``.

    ``repository`` and ports None leave them out (a platform such as KServe's Triton runtime sets them).
    ``host`` None leaves the bind addresses at Triton's default (all interfaces: containers);
    ``admin_key`` None leaves the admin APIs open (only for a loopback-only local server).
    ``model_control`` ``explicit`` loads exactly ``load_models`` at start (and allows load/unload
    over the restricted repository API).
    """

    repository: str | None
    http_port: int | str | None = 8000
    grpc_port: int | str | None = 8001
    metrics_port: int | str | None = 8002
    host: str | None = None
    model_control: str = "none"
    load_models: tuple[str, ...] = ()
    config_name: str | None = None
    admin_key: str | None = SHELL_ADMIN_KEY
    binary: str | None = "tritonserver"
    backend_directory: str | None = None
    cache_directory: str | None = None
    log_file: str | None = None
    exit_timeout_s: int | None = None
    gpu_metrics: bool | None = None
    metrics_interval_ms: int | None = None  # how often Triton refreshes its gauges (None: its default, 2000)
    backend_config: tuple[str, ...] = ()
    extra_repositories: tuple[str, ...] = ()  # more --model-repository folders (the plans built at deploy)
    # False where models are loaded after the start (the plans built at deploy): under strict readiness one plan whose
    # load failed leaves /v2/health/ready at 400 for good, even after its unload (measured on tritonserver 2.51)
    strict_readiness: bool = True


def tritonserver_args(server: ServerArgs) -> list[str]:
    """The full command line (binary first; a ``None`` binary leaves it out) for ``server``."""
    require(server.model_control in MODEL_CONTROL_MODES, f"unknown model control mode '{server.model_control}'",
            f"use one of: {', '.join(MODEL_CONTROL_MODES)}")
    require(not server.load_models or server.model_control == "explicit",
            "models to load at start need explicit model control", "set model_control='explicit'")
    args = [server.binary] if server.binary else []
    if server.repository is not None:
        args.append(f"--model-repository={server.repository}")
    args += [f"--model-repository={folder}" for folder in server.extra_repositories]
    if server.backend_directory:
        args.append(f"--backend-directory={server.backend_directory}")
    if server.cache_directory:
        args.append(f"--cache-directory={server.cache_directory}")
    if server.config_name:
        args.append(f"--model-config-name={server.config_name}")
    args.append(f"--model-control-mode={server.model_control}")
    args += [f"--load-model={model}" for model in server.load_models]
    args += [
        f"--strict-readiness={'true' if server.strict_readiness else 'false'}",
        "--exit-on-error=true",
        # Our configs are complete (built from the model's signature); auto-completion would only
        # second-guess them (and, in the local Python backend, start an idle stub per model).
        "--disable-auto-complete-config",
    ]
    for endpoint, port in (("http", server.http_port), ("grpc", server.grpc_port), ("metrics", server.metrics_port)):
        if server.host is not None:
            args.append(f"--{endpoint}-address={server.host}")
        if port is not None:
            args.append(f"--{endpoint}-port={port}")
    if server.gpu_metrics is not None:
        args.append(f"--allow-gpu-metrics={str(server.gpu_metrics).lower()}")
    if server.metrics_interval_ms is not None:
        args.append(f"--metrics-interval-ms={server.metrics_interval_ms}")
    if server.exit_timeout_s is not None:
        args.append(f"--exit-timeout-secs={server.exit_timeout_s}")
    if server.log_file:
        args.append(f"--log-file={server.log_file}")
    args += [f"--backend-config={item}" for item in server.backend_config]
    if server.admin_key is not None:
        args += restricted_api_args(server.admin_key)
    return args


def shell_command(args: Sequence[str]) -> str:
    """One shell command line; arguments holding ``$`` are double-quoted so the shell expands them."""
    return " ".join(f'"{_bash_dq(a)}"' if "$" in a else shlex.quote(a) for a in args)


def _bash_dq(text: str) -> str:
    """Escape ``text`` for a double-quoted bash string, keeping ``$name`` / ``${...}`` expansions."""
    return "".join("\\" + c if c in '\\"`' else c for c in text)
