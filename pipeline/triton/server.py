"""Run the embedded ``tritonserver`` (from the nvidia-pytriton wheel) on a Triton model repository, on CPU
or, where there is an NVIDIA GPU and onnxruntime-gpu (the ``gpu-serve`` extra), with GPU instances.

The wheel ships the real Triton 2.51 binary with only the Python backend. At start we prepare a private
backend directory: the Python backend (its library, utils and the stub built for this interpreter's
Python version) plus our Python-based ``onnxruntime`` backend, so ``platform: "onnxruntime_onnx"`` models
load unchanged. The stub embeds Python and finds the project's venv through ``PATH`` (as PyTriton does);
``LD_LIBRARY_PATH`` gets the wheel's bundled libraries and this interpreter's ``libpython``.

Models that cannot run here (TensorRT plans, other missing backends) are skipped: the server is started
on a private *view* of the repository (one symlink per loadable model), so the on-disk repository stays
untouched and ``--model-control-mode none`` still loads everything in the view. Without a GPU, models
whose config asks for ``KIND_GPU`` instances are served as ``KIND_CPU`` (``servable.write_view``). With a
GPU, Triton resolves ``KIND_AUTO`` to ``KIND_GPU`` and the backend runs ONNX Runtime's CUDA (and, where
TensorRT's libraries exist, TensorRT) execution provider; a CPU-only ONNX Runtime is refused up front. The
command line comes from :mod:`pipeline.triton.server_args`, shared with the deploy bundles.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from pipeline.core.errors import PipelineError, require
from pipeline.core.isolate import die_with_parent
from pipeline.core.objectstore import S3Url
from pipeline.core.progress import progress
from pipeline.triton.procs import client_host, exit_cause, free_ports, peek_exit, port_taken, wait_group_gone
from pipeline.triton.s3repository import readable_configs
from pipeline.triton.servable import gpu_instance_models, require_cpu_int8_runs_here, require_gpu_runtime
from pipeline.triton.servable import has_gpu, servable_models, write_view
from pipeline.triton.server_args import ADMIN_HEADER, ADMIN_KEY_ENV, ServerArgs, redacted, tritonserver_args
from pipeline.triton.server_log import PortInUseError, last_errors, startup_error

log = logging.getLogger(__name__)

OUR_BACKENDS = Path(__file__).parent / "backends"
SHM_DIR = Path("/dev/shm")
EXIT_TIMEOUT_S = 5
# Ports the OS called free can be taken before tritonserver binds them (a client's outgoing connection
# or another server starting at the same moment): free ports are picked again this many times.
PORT_ATTEMPTS = 3
# Talk to our own server directly, whatever http_proxy says.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
# explicit: every model still loads at start (--load-model=*), and the repository API can load
# others or reload one with a config override (what `tune` does per candidate).
MODEL_CONTROL_MODES = ("none", "explicit")  # what the embedded server offers (no polling of a live repository)


@functools.cache
def _dist() -> tuple[Path, Path]:
    """The wheel's ``tritonserver`` directory and its bundled shared libraries."""
    try:
        from pytriton.utils.distribution import get_libs_path, get_root_module_path
    except ImportError as exc:
        raise PipelineError(
            f"serving needs the nvidia-pytriton wheel, which ships tritonserver, but it is not importable ({exc})",
            "install the project's dependencies: pip install -e .",
        ) from None

    return get_root_module_path() / "tritonserver", Path(get_libs_path())


def _ort_providers() -> list[str]:
    import onnxruntime

    return list(onnxruntime.get_available_providers())


class TritonServer:
    """The embedded ``tritonserver`` serving a model repository (CPU, or GPU where there is one); use as a context manager.

    Ports 0 pick free ports. ``cpus`` pins the server (and its backend stubs) to those cores.
    ``model_control="explicit"`` keeps the repository API's load/unload open (all models still load
    at start); ``admin_key`` restricts the admin APIs to the ``admin-key`` header with that value, as
    the production launch scripts do (:func:`pipeline.triton.server_args.restricted_api_args`).
    ``metrics_interval_ms`` sets how often Triton refreshes its metric gauges (None: Triton's 2000 ms).
    ``log_path`` defaults to ``<workdir>/triton/tritonserver-<http port>.log``; it is emptied at start and
    also gets the server's stdout/stderr. ``extra_args`` are appended to the tritonserver command line.
    The server gets SIGTERM when the *thread* that called :meth:`start` exits (PR_SET_PDEATHSIG, so a
    killed Python leaves no server behind): start it from a thread that outlives it.
    """

    def __init__(
        self,
        repository: Path | S3Url,
        *,
        host: str = "127.0.0.1",
        http_port: int = 0,
        grpc_port: int = 0,
        metrics_port: int = 0,
        log_path: Path | None = None,
        workdir: Path = Path("build"),
        cpus: Sequence[int] | None = None,
        model_config_name: str | None = None,
        extra_args: Sequence[str] = (),
        model_control: str = "none",
        admin_key: str | None = None,
        metrics_interval_ms: int | None = None,
    ) -> None:
        self.repository = repository if isinstance(repository, S3Url) else Path(repository)
        self.host = host
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        self.log_path = log_path
        self.log_dir = Path(workdir) / "triton"
        self.cpus = list(cpus) if cpus is not None else None
        self.model_config_name = model_config_name
        self.extra_args = list(extra_args)
        require(model_control in MODEL_CONTROL_MODES, f"unknown model control mode '{model_control}'",
                f"use one of: {', '.join(MODEL_CONTROL_MODES)}")
        require(admin_key is None or bool(admin_key.strip()), "the admin key is empty", f"set ${ADMIN_KEY_ENV} to a secret")
        self.model_control = model_control
        self.admin_key = admin_key
        self.metrics_interval_ms = metrics_interval_ms
        self.ready_models: list[str] = []
        self.skipped_models: dict[str, str] = {}
        self.cpu_models: list[str] = []  # KIND_GPU configs served as KIND_CPU (no GPU here)
        self.startup_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._local: Path | None = None  # what the server reads, as a folder (a copy of an s3:// repository's configs)
        self._s3_env: dict[str, str] = {}
        self._shm_prefix = f"pipeline_triton_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self.restarts = 0  # how often restart() brought the server back
        self._append_log = False  # a restart keeps the log of the run that died

    @property
    def http_url(self) -> str:
        return f"{client_host(self.host)}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{client_host(self.host)}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"{client_host(self.host)}:{self.metrics_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def is_running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._exit_status() is None

    def exit_cause(self) -> str:
        """Why the server process ended ("killed by SIGKILL", "exited with status 134"), without reaping it."""
        if self._process is None:
            return "not running (its last start failed or it was stopped)"
        return exit_cause(self._process)

    def restart(self, timeout: float = 120.0) -> None:
        """Start a server that died again, on the same ports and log (appended to), and wait until it is ready.

        Its leftovers (backend stubs of the old process group, shared-memory segments) are removed first."""
        self.stop()
        self._append_log = True
        try:
            self.start(timeout=timeout)
        finally:
            self._append_log = False
        self.restarts += 1

    def _exit_status(self) -> int | None:
        """The server's exit status once it has exited, without reaping it.

        Until stop() reaps it, its PID cannot be reused, so killing its process group stays safe.
        """
        assert self._process is not None
        return peek_exit(self._process)

    def start(self, timeout: float = 120.0) -> None:
        """Launch the server and wait until it and every loadable model are ready."""
        require(self._process is None, "this TritonServer was already started", "create a new TritonServer per run")
        began = time.monotonic()
        self._check_cpus()
        models = self._scan_repository()
        if self.host not in _LOOPBACK:
            log.warning(
                "tritonserver binds to %s: its inference, model-repository and metrics endpoints have no "
                "authentication — anyone who can reach this address can use them", self.host,
            )
        requested = (self.http_port, self.grpc_port, self.metrics_port, self.log_path)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self._assign_ports()
            try:
                self._start_once(models, began + timeout)
                break
            except PortInUseError as exc:
                if attempt == PORT_ATTEMPTS or all(requested[:3]):
                    raise
                log.info("%s; picking free ports again", exc.problem)
                self.http_port, self.grpc_port, self.metrics_port, self.log_path = requested
        self.startup_seconds = time.monotonic() - began
        log.info(
            "tritonserver ready in %.1f s: http %s, grpc %s, metrics %s; models %s (log: %s)",
            self.startup_seconds, self.http_url, self.grpc_url, self.metrics_url,
            ", ".join(self.ready_models), self.log_path,
        )

    def _start_once(self, models: list[str], deadline: float) -> None:
        try:
            if self._workdir is None:  # a retry: stop() removed the last attempt's files
                self._scan_repository()
            assert self._workdir is not None and self._local is not None
            backends = self._prepare_backends(self._workdir / "backends")
            gpu = has_gpu()
            if gpu:
                require_gpu_runtime(gpu_instance_models(self._local, models, self.model_config_name), _ort_providers())
            if isinstance(self.repository, S3Url):
                from pipeline.triton.s3repository import serving_target

                target, self._s3_env = serving_target(self.repository, self._local, models, self.model_config_name, gpu=gpu)
                load = sorted(models)
            else:
                view = self._workdir / "repository"
                view.mkdir()
                self.cpu_models = write_view(self.repository, models, view, self.model_config_name, cpu_only=not gpu)
                target, load = str(view), sorted(p.name for p in view.iterdir())
            with progress(f"starting tritonserver ({len(models)} models)", summary=False):  # it logs its own ready line
                self._launch(target, load, backends)
                self._wait_ready(models, deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server (SIGKILL its process group after ``timeout``), then remove its temp files."""
        process, self._process = self._process, None
        if process is not None:
            deadline = time.monotonic() + timeout
            # os.kill, not Popen.send_signal: that polls, and reaping now would free the PID too early.
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            while peek_exit(process) is None:
                if time.monotonic() > deadline:
                    log.warning("tritonserver (pid %d) did not stop within %.0f s; killing it", process.pid, timeout)
                    break
                time.sleep(0.05)
            # The group holds the server and its Python backend stubs, which a killed server leaves behind.
            # The server is not reaped yet, so its PID (the group's id) cannot belong to anyone else.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            wait_group_gone(process.pid, 5.0)
        # Segments survive a killed server; ours all carry this server's unique prefix.
        for segment in SHM_DIR.glob(f"{self._shm_prefix}*"):
            with contextlib.suppress(FileNotFoundError):
                segment.unlink()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self._local, self._s3_env = None, {}

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- preparation -----------------------------------------------------------------------------

    def _check_cpus(self) -> None:
        if self.cpus is None:
            return
        allowed = os.sched_getaffinity(0)
        require(
            bool(self.cpus) and set(self.cpus) <= allowed,
            f"cannot pin tritonserver to CPUs {self.cpus}: this process may use only {sorted(allowed)}",
            "pick CPUs from that list (or fewer --slices)",
        )

    def _scan_repository(self) -> list[str]:
        """Names of the models to serve; fills ``skipped_models`` with the others and why."""
        backends = {p.name for p in self._shipped_backends()} | {p.name for p in OUR_BACKENDS.iterdir() if p.is_dir()}
        self._workdir = Path(tempfile.mkdtemp(prefix="pipeline-triton-"))
        try:
            self._local = local = readable_configs(self.repository, self._workdir / "configs")
        except BaseException:
            self.stop()
            raise
        models, self.skipped_models = servable_models(local, backends, self.model_config_name)
        require_cpu_int8_runs_here(self.repository, local, models)
        return models

    def _assign_ports(self) -> None:
        named = {"http": self.http_port, "grpc": self.grpc_port, "metrics": self.metrics_port}
        fixed = [port for port in named.values() if port]
        require(len(fixed) == len(set(fixed)), f"the HTTP, gRPC and metrics ports must differ, got {named}",
                "give each endpoint its own port")
        for what, port in named.items():
            if port and port_taken(self.host, port):
                raise PipelineError(
                    f"port {port} on {self.host} (for {what}) is already in use",
                    f"stop whatever listens there (ss -ltnp 'sport = :{port}') or choose another "
                    f"port with --{what}-port (0 picks a free one)",
                )
        free = iter(p for p in free_ports(self.host, 3 + len(fixed)) if p not in fixed)
        self.http_port = self.http_port or next(free)
        self.grpc_port = self.grpc_port or next(free)
        self.metrics_port = self.metrics_port or next(free)

    @staticmethod
    def _shipped_backends() -> list[Path]:
        root, _ = _dist()
        return [p for p in (root / "backends").iterdir() if p.is_dir()]

    def _prepare_backends(self, target: Path) -> Path:
        """A backend directory: the wheel's backends plus ours, with the stub for this Python version."""
        root, _ = _dist()
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
        require(stub.is_file(), f"nvidia-pytriton ships no Python backend stub for Python {version}",
                "run the pipeline with a Python version the wheel supports (3.8-3.13)")
        # Copies, not symlinks: Triton refuses a backend library whose real path leaves its directory.
        for backend in self._shipped_backends():
            shutil.copytree(backend, target / backend.name, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(stub, target / "python" / "triton_python_backend_stub")
        for backend in OUR_BACKENDS.iterdir():
            if backend.is_dir():
                shutil.copytree(backend, target / backend.name, ignore=shutil.ignore_patterns("__pycache__"))
        return target

    def _environment(self) -> dict[str, str]:
        _, libs = _dist()
        env = dict(os.environ)
        # The stub's embedded Python takes its prefix (and so the venv's site-packages) from the first
        # `python3` on PATH — put this interpreter's first, as PyTriton does.
        env["PATH"] = os.pathsep.join([str(Path(sys.exec_prefix) / "bin"), env.get("PATH", "")])
        lib_dirs = [str(libs)]
        libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
        if libdir and soname and (Path(libdir) / soname).exists():
            lib_dirs.insert(0, libdir)  # the libpython matching this interpreter's stdlib, not the system one
        env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs + [env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
        env.update(self._s3_env)  # an s3:// repository's credentials: the environment, never the command line
        return env

    def _command(self, target: str, load: list[str], backends: Path) -> list[str]:
        root, _ = _dist()
        # Models that cannot load here are left out of an s3:// repository by loading the others explicitly.
        mode = "explicit" if self.skipped_models and isinstance(self.repository, S3Url) else self.model_control
        server = ServerArgs(
            repository=target,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            host=self.host,
            # The view holds exactly the loadable models, so loading everything at start is right.
            model_control=mode,
            load_models=tuple(load) if mode == "explicit" else (),
            config_name=self.model_config_name,
            # Open on loopback unless a key is given (tune and its tests restrict it as production does).
            admin_key=self.admin_key,
            binary=str(root / "bin" / "tritonserver"),
            backend_directory=str(backends),
            cache_directory=str(root / "caches"),
            log_file=str(self.log_path),
            # Idle keep-alive client connections hold a SIGTERMed server for the whole exit timeout
            # (30 s by default); in-flight requests of these small models finish well within 5 s.
            exit_timeout_s=EXIT_TIMEOUT_S,
            # GPU utilization, memory and power per GPU (nv_gpu_*), where there is one: the MIG plan's inputs.
            gpu_metrics=has_gpu(),
            metrics_interval_ms=self.metrics_interval_ms,
            # Unique per server: several servers (MIG rehearsal) must not share segment names.
            backend_config=(f"python,shm-region-prefix-name={self._shm_prefix}",),
        )
        return tritonserver_args(server) + self.extra_args

    def _launch(self, target: str, load: list[str], backends: Path) -> None:
        if self.log_path is None:
            self.log_path = self.log_dir / f"tritonserver-{self.http_port}.log"
        self.log_path = self.log_path.resolve()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._append_log:
            with open(self.log_path, "a") as previous:
                previous.write(f"---- pipeline: tritonserver restarted at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} ----\n")
        else:
            self.log_path.write_text("")  # Triton appends; start each run with an empty log
        cpus = self.cpus

        def child_setup() -> None:
            # Die with the parent (no stray server if Python is killed), and pin before any thread starts.
            die_with_parent(signal.SIGTERM)
            if cpus is not None:
                os.sched_setaffinity(0, cpus)

        command = self._command(target, load, backends)
        log.debug("starting %s", redacted(command))
        # Server and stubs print outside the log file too (startup errors, Python tracebacks): same file.
        with open(self.log_path, "ab") as console:
            self._process = subprocess.Popen(
                command, env=self._environment(), stdin=subprocess.DEVNULL, stdout=console,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=child_setup,
            )

    # -- readiness -------------------------------------------------------------------------------

    def _get(self, path: str, data: bytes | None = None) -> tuple[int, bytes]:
        headers = {ADMIN_HEADER: self.admin_key} if self.admin_key is not None else {}
        request = urllib.request.Request(f"http://{self.http_url}{path}", data=data, headers=headers)
        try:
            with _DIRECT.open(request, timeout=2.0) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, b""

    def _wait_ready(self, models: list[str], deadline: float) -> None:
        assert self._process is not None
        while True:
            code = self._exit_status()
            if code is not None:
                view = {str(self._workdir / "repository"): str(self.repository.resolve())} if self._workdir and isinstance(self.repository, Path) else {}
                raise startup_error(self.log_path, code, view)
            if self._get("/v2/health/ready")[0] == 200:
                break
            if time.monotonic() > deadline:
                raise PipelineError(
                    f"tritonserver did not become ready in time; last log lines: {last_errors(self.log_path)}",
                    f"see {self.log_path}; a larger start timeout helps on a busy machine",
                )
            time.sleep(0.1)
        status, body = self._get("/v2/repository/index", data=b"{}")
        index = json.loads(body) if status == 200 else []
        self.ready_models = sorted(entry["name"] for entry in index if entry.get("state") == "READY")
        missing = sorted(set(models) - set(self.ready_models))
        require(not missing, f"tritonserver is ready but models {missing} are not", f"see {self.log_path}")
