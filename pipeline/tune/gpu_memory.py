"""GPU memory of one trial, from Triton's ``nv_gpu_memory_used_bytes`` gauges on ``/metrics``.

Before a candidate loads, the model is unloaded (its instances, and their processes, go) and the
gauges are read until they stop falling: the baseline. After the load (which runs the config's
warm-up, max batch included) and after the load ramp, the gauges are read once more each, after
one refresh. The model's memory is after-ramp − baseline; per instance, that divided by the
instances: the instance count on every GPU whose memory rose (a ``count`` instance group puts
``count`` instances on each GPU the server sees).

The gauges count the whole GPU, so another process allocating or freeing memory during a trial
moves the numbers (:data:`SOURCE` says so in every record). Triton refreshes them every
``--metrics-interval-ms`` (2000 ms by default, which a remote server is assumed to use; the
embedded server of `tune` runs with :data:`EMBEDDED_REFRESH_MS`). A CPU-only server, or one on a
MIG instance, exports no GPU gauges: nothing is measured and nothing is said.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.loadtest.client import Endpoint
from pipeline.loadtest.metrics import scrape

log = logging.getLogger(__name__)

MIB = 1 << 20
SOURCE = ("nv_gpu_memory_used_bytes on Triton's /metrics, summed over GPUs: the whole GPU's used memory, "
          "so other processes on the GPU move it")
EMBEDDED_REFRESH_MS = 500
TRITON_DEFAULT_REFRESH_MS = 2000
SETTLE_REFRESHES = 2  # the baseline holds (does not fall) over this many gauge refreshes
MAX_SETTLE_S = 8.0
REFRESH_MARGIN = 1.25  # wait a bit over one refresh so the gauge has surely been refreshed
ROSE_BYTES = 16 * MIB  # a GPU whose used memory rose by more holds instances of the model

Reading = dict[str, int]  # GPU uuid → used bytes


@dataclass(frozen=True)
class GpuMemory:
    """What one trial's model took on the GPU(s), in bytes of the summed gauge."""

    baseline_bytes: int  # with the model unloaded, once the gauge stopped falling
    after_load_bytes: int  # after the load and its warm-up
    after_ramp_bytes: int  # after the load ramp
    instances: int  # instances the memory is spread over (instance count × GPUs holding them)
    gpus: int  # GPUs whose used memory rose
    settled: bool = True  # False: the baseline still fell when the wait ran out
    source: str = SOURCE

    @property
    def model_bytes(self) -> int:
        """After-ramp − baseline."""
        return self.after_ramp_bytes - self.baseline_bytes

    @property
    def per_instance_bytes(self) -> int:
        """Model bytes per instance (0 when the gauge fell: something else freed memory meanwhile)."""
        return max(0, self.model_bytes) // max(1, self.instances)

    def to_dict(self) -> dict[str, Any]:
        """The ``gpu_memory`` entry of a trial in tune.json and the cache."""
        return {"baseline_bytes": self.baseline_bytes, "after_load_bytes": self.after_load_bytes,
                "after_ramp_bytes": self.after_ramp_bytes, "model_bytes": self.model_bytes,
                "per_instance_bytes": self.per_instance_bytes, "instances": self.instances, "gpus": self.gpus,
                "settled": self.settled, "source": self.source}

    @classmethod
    def from_dict(cls, data: Any) -> GpuMemory | None:
        """A trial's ``gpu_memory`` back (None: not measured, e.g. a trial cached before it was)."""
        if not isinstance(data, dict):
            return None
        return cls(int(data["baseline_bytes"]), int(data["after_load_bytes"]), int(data["after_ramp_bytes"]),
                   int(data["instances"]), int(data["gpus"]), bool(data.get("settled", True)), str(data.get("source", SOURCE)))


def record(baseline: Reading, settled: bool, after_load: Reading, after_ramp: Reading, instance_count: int) -> GpuMemory:
    """One trial's :class:`GpuMemory` from its three readings."""
    gpus = max(1, sum(after_ramp[uuid] - baseline.get(uuid, 0) > ROSE_BYTES for uuid in after_ramp))
    return GpuMemory(sum(baseline.values()), sum(after_load.values()), sum(after_ramp.values()),
                     max(1, instance_count) * gpus, gpus, settled)


class MemoryMeter:
    """Reads the GPU memory gauges of one server; ``clock`` and ``sleep`` are time.monotonic and
    time.sleep but for tests. The first reading decides whether there are gauges at all: a server
    without them is not asked again."""

    def __init__(self, endpoint: Endpoint, refresh_s: float, *, max_settle_s: float = MAX_SETTLE_S,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.endpoint = endpoint
        self.refresh_s = refresh_s
        self.max_settle_s = max_settle_s
        self.clock = clock
        self.sleep = sleep
        self.present: bool | None = None  # None until the first reading

    def read(self) -> Reading | None:
        """Used bytes per GPU now (as of the gauge's last refresh); None without GPU gauges."""
        if self.present is False:
            return None
        try:
            gpus = scrape(self.endpoint).gpus
        except OSError as exc:
            if self.present is None:
                log.info("GPU memory not measured: cannot read %s/metrics (%s)", self.endpoint.address, exc)
                self.present = False
            else:
                log.warning("GPU memory of this trial not measured: cannot read %s/metrics (%s)", self.endpoint.address, exc)
            return None
        reading = {g.uuid: int(g.memory_used_bytes) for g in gpus if g.memory_used_bytes is not None}
        if self.present is None:
            self.present = bool(reading)
        return reading or None

    def settled(self) -> tuple[Reading, bool] | None:
        """Read until the summed gauge has not fallen for SETTLE_REFRESHES refreshes (polling twice
        per refresh, at most ``max_settle_s``): the last reading, and whether it settled in time."""
        reading = self.read()
        if reading is None:
            return None
        low, since = sum(reading.values()), self.clock()
        deadline = since + self.max_settle_s
        while self.clock() - since < SETTLE_REFRESHES * self.refresh_s:
            if self.clock() >= deadline:
                log.info("the GPU memory gauge still fell after %.0f s; the baseline may be high", self.max_settle_s)
                return reading, False
            self.sleep(self.refresh_s / 2)
            now = self.read()
            if now is None:
                return None
            reading = now
            if sum(now.values()) < low:
                low, since = sum(now.values()), self.clock()
        return reading, True

    def refreshed(self) -> Reading | None:
        """The gauges once they have refreshed after this moment."""
        if self.present is False:
            return None
        self.sleep(self.refresh_s * REFRESH_MARGIN)
        return self.read()
