"""Named pause points: a test hook that holds a process at a chosen point so a test can kill it there.

A test that must interrupt a build at an exact moment (between two calibration batches, between
two model swaps of a publish) cannot win a race against a stage that takes a tenth of a second.
Instead it starts the process with::

    PIPELINE_PAUSE_AT=<point>[#<n>]     # pause at the n-th time <point> is reached (default: the first)
    PIPELINE_PAUSE_FILE=<path>          # written (with the pid) once the process is paused

waits for ``<path>`` to appear, and then kills the process (or creates ``<path>.release`` to let it
go on). Without ``PIPELINE_PAUSE_AT`` a pause point costs one environment lookup and does nothing.

Points (each called where named): ``int8.calibration-batch`` after each calibration batch
(pipeline/stages/int8.py); ``publish.swap`` before each model directory is swapped into the
repository (pipeline/triton/repository.py), so ``publish.swap#1`` holds a publish with every
model staged and none swapped in, and ``publish.swap#2`` holds it between the first two swaps.
``tune.trial-cached`` after each tune trial is written to the trial cache (pipeline/tune/cache.py), so
``tune.trial-cached#2`` holds a tune with exactly two trials durable. ``savedmodel.export`` and
``tf2onnx.convert`` hold the build's child processes (the SavedModel export
child, the tf2onnx subprocess) as they start, so a test can kill the build under them. ``shard.ready``
holds a load-test shard just before it writes its ready file (pipeline/loadtest/shards.py), so a test
sees the other shards wait for it at the barrier. ``loadtest.window`` after each measurement window
(pipeline/loadtest/measure.py): the load's connections and shared-memory regions are live there.
``publish.upload`` before each file of an S3 publish, and ``publish.upload-bytes`` after each chunk of one
(pipeline/triton/s3repository.py), so a test can kill a publish part way through a 2 GB data file.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from pathlib import Path

log = logging.getLogger(__name__)

ENV_AT = "PIPELINE_PAUSE_AT"
ENV_FILE = "PIPELINE_PAUSE_FILE"
RELEASE_SUFFIX = ".release"
_POLL_S = 0.05

_reached: Counter[str] = Counter()


def pause_point(name: str) -> None:
    """Block here if ``$PIPELINE_PAUSE_AT`` names this point (and this is its n-th visit); else return at once.

    While blocked, ``$PIPELINE_PAUSE_FILE`` (default ``./<name>.paused``) holds this process's pid;
    the process stays blocked until it is killed or ``<that file>.release`` exists.
    """
    wanted = os.environ.get(ENV_AT)
    if not wanted:
        return
    point, _, nth = wanted.partition("#")
    if point != name:
        return
    _reached[name] += 1
    if _reached[name] != int(nth or 1):
        return
    marker = Path(os.environ.get(ENV_FILE) or f"{name}.paused")
    release = marker.with_name(marker.name + RELEASE_SUFFIX)
    log.warning("paused at %s (test hook %s); waiting for %s or a kill", wanted, ENV_AT, release)
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}")
    tmp.write_text(f"{os.getpid()}\n")
    os.replace(tmp, marker)  # the test sees the file whole or not at all
    while not release.exists():
        time.sleep(_POLL_S)
