"""Shared test helpers: run the real CLI in a subprocess, and locate repo files."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--heavy", action="store_true", help="also run the heavy zoo models (Keras Applications backbones; see README)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--heavy"):
        return
    skip = pytest.mark.skip(reason="heavy zoo model (a Keras Applications backbone: 5-10 min on 2 cores, see the README zoo "
                                   "table): run with --heavy")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: object, exitstatus: int, config: pytest.Config) -> None:
    """Print the random-order seed at the end even with ``-q`` (which hides the header that names
    it), so a failure in a shuffled run can be replayed with ``--random-order-seed=N``."""
    if config.pluginmanager.hasplugin("random_order"):
        from random_order.config import Config

        order = Config(config)
        if order.is_enabled:
            terminalreporter.write_line(f"random order: --random-order-bucket={order.bucket_type} --random-order-seed={order.seed}")  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _sigint_untouched() -> object:
    """No test may leave Ctrl-C handling changed in the pytest process: an ignored SIGINT is inherited
    by every later subprocess, so the Ctrl-C tests of whichever test ran next would fail."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"the test changed the SIGINT handler of the test process from {before!r} to {after!r}")


def cli(*args: str, cwd: Path = ROOT, timeout: float = 600, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pipeline ARGS`` for real; tests/ is importable so `tests.keras_models:…` works.
    ``env`` adds variables; a None value removes one."""
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), TF_CPP_MIN_LOG_LEVEL="3", COLUMNS="200")
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def _default_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_interruptible(command: list[str], **kwargs: object) -> subprocess.Popen[str]:
    """Start ``command`` (text pipes for stdout/stderr) with Ctrl-C at its default disposition. A
    process started in the background by a non-interactive shell (``pytest ... &``, a CI runner's
    job) has SIGINT ignored, every child inherits that, and a Python child that finds SIGINT ignored
    rightly keeps ignoring it: a test of Ctrl-C handling must not depend on how pytest was started."""
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint, **kwargs)  # type: ignore[call-overload]


def interrupt_when_ready(process: subprocess.Popen[str], ready: Callable[[], bool], what: str, poll_s: float = 0.1) -> str:
    """Send Ctrl-C (SIGINT) to ``process`` once ``ready()`` holds (a hang guard, not a speed limit);
    assert it stopped cleanly with exit 130 and one 'interrupted' line; return its stderr."""
    import signal
    import time

    try:
        deadline = time.monotonic() + 600
        while not ready():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, f"{what} never happened"
            time.sleep(poll_s)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err
    return err


def one_line_error(proc: subprocess.CompletedProcess[str], status: int = 2) -> str:
    """Assert the process failed with one 'error:' line and no traceback, exit ``status`` (2: bad usage or
    input; 1: a measured check failed); return the line."""
    assert proc.returncode == status, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    return errors[0]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def gigabytes_on_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """For a test that writes gigabytes (a model over 2 GB, its copies): one such test at a time across the xdist
    workers, so two of them never need their disk at once. The lock file lies in the run's folder all workers share."""
    import fcntl

    shared = tmp_path_factory.getbasetemp()
    shared = shared.parent if shared.name.startswith("popen-gw") else shared
    with open(shared / "gigabytes-on-disk.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


QUIET_UNSET: dict[str, str | None] = {"TF_CPP_MIN_LOG_LEVEL": None, "GRPC_VERBOSITY": None}


@dataclass(frozen=True)
class Built:
    """Where the shared default-model build wrote: the workdir, the repository, and the deploy bundle."""

    workdir: Path
    repository: Path
    deploy: Path
    output: str = ""  # what the build printed (stdout, then stderr), piped, with the user's environment


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The default model built once per test session with --fp16 --int8 (tests must not change it)."""
    root = tmp_path_factory.getbasetemp() / "digits-e2e"
    result = Built(root / "build", root / "model_repository", root / "deploy")
    if not (result.workdir / "digits" / "published.json").is_file():
        # As a user runs it: no log-level variables of ours, so tests/commands/test_quiet.py can check its output.
        proc = cli("build", "--fp16", "--int8", "--workdir", str(result.workdir), "--repository", str(result.repository),
                   env=QUIET_UNSET)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        result = replace(result, output=proc.stdout + proc.stderr)
    return result
