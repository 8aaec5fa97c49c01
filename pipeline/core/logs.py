"""Quiet by default: what TensorFlow, absl, gRPC and Polygraphy print stays out of a command's output
unless ``-v``; the same rules in the command's process and in every child it spawns.

* Environment (read by the C++ libraries at import, so set before any import and inherited by
  children): ``TF_CPP_MIN_LOG_LEVEL=3``, ``GRPC_VERBOSITY=ERROR`` unless already set.
* TensorFlow 2.21 logs its oneDNN notice through absl before absl is initialised, which ignores
  ``TF_CPP_MIN_LOG_LEVEL`` (it also prints "All log messages before absl::InitializeLog() …").
  A child process that imports TensorFlow sends its file descriptor 2 through
  :func:`native_stderr_filtered`, which drops exactly those informational lines and passes everything
  else (errors, crashes) through.
* Polygraphy prints to stdout by default; it goes through Python logging (logger ``Polygraphy``)
  without colours (whose absence it otherwise announces), errors only unless ``-v``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator

# Python loggers of third-party packages; with -v the first ones show their info lines too.
_VERBOSE_WITH_V = ("tensorflow", "absl", "tf2onnx", "Polygraphy")
_QUIET = ("tensorflow", "absl", "tf2onnx", "h5py", "matplotlib", "PIL", "urllib3", "polygraphy", "Polygraphy")

# absl's informational lines ("I1201 12:00:00.123456   1234 port.cc:153] ...", also "I0000 00:00:<epoch>")
# and its preamble. Warnings and errors of native code are not matched: they pass.
NATIVE_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} [\d:.]+\s+\d+ [\w.\-]+:\d+\] .*)$"
)


def quiet_environment(verbose: bool) -> None:
    """Set the C++ libraries' log levels in the environment (this process and its children)."""
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def quiet_libraries(verbose: bool) -> None:
    """Set the third-party Python loggers and Polygraphy's logger for this process."""
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose and name in _VERBOSE_WITH_V else logging.WARNING)
    logging.getLogger("Polygraphy").setLevel(logging.DEBUG if verbose else logging.ERROR)
    try:
        from polygraphy.logger import G_LOGGER
    except ImportError:  # a client-only install (loadtest, mig-plan) has nothing of Polygraphy's to quiet
        return

    G_LOGGER.colors = False
    G_LOGGER.use_python_logging_system = True
    G_LOGGER.module_severity = G_LOGGER.INFO if verbose else G_LOGGER.ERROR


@contextlib.contextmanager
def native_stderr_filtered() -> Iterator[None]:
    """While inside, lines written to file descriptor 2 (by native code) that match :data:`NATIVE_NOISE`
    are dropped and the rest are passed on; ``sys.stderr`` (Python's logging) writes to the real stderr."""
    sys.stderr.flush()
    real = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    python_stderr = sys.stderr
    sys.stderr = os.fdopen(os.dup(real), "w", buffering=1, encoding=python_stderr.encoding, errors="backslashreplace")
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is python_stderr:
            handler.setStream(sys.stderr)

    def forward() -> None:
        with os.fdopen(read_end, "rb") as pipe:
            for line in pipe:
                if not NATIVE_NOISE.match(line.decode(errors="replace").rstrip("\r\n")):
                    os.write(real, line)

    thread = threading.Thread(target=forward, name="native-stderr", daemon=True)
    thread.start()
    try:
        yield
    finally:
        os.dup2(real, 2)  # closes the pipe's last write end (unless a grandchild still holds it)
        thread.join(timeout=5.0)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
                handler.setStream(python_stderr)
        sys.stderr.close()
        sys.stderr = python_stderr
        os.close(real)
