"""Named points where a process can be asked to stop and wait, so tests kill it at an exact moment.

``PIPELINE_WAIT_AT=<point>`` with ``PIPELINE_WAIT_MARKER=<file>`` makes the process that reaches
``<point>`` write its PID to the marker file and then wait forever (until it is killed). Unset — always, outside tests —
:func:`wait_point` does nothing. Points: ``int8:calibrating`` (the INT8 stage's temporaries exist),
``publish:staged`` (every new model directory is staged beside the repository, none swapped in),
``publish:swapped-one`` (the first model directory is swapped in, the others not yet).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

ENV = "PIPELINE_WAIT_AT"
MARKER_ENV = "PIPELINE_WAIT_MARKER"


def wait_point(name: str) -> None:
    """Wait here forever if ``PIPELINE_WAIT_AT`` names this point (after writing the marker file)."""
    marker = os.environ.get(MARKER_ENV)
    if os.environ.get(ENV) != name or not marker:
        return
    Path(marker).write_text(f"{os.getpid()}\n")
    while True:
        time.sleep(3600)
