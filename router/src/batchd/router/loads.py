"""The load the router sees per replica: its own requests in flight, corrected by `GET /load`.

The router's own count is exact and changes with every request; what other routers and direct
clients send a replica only the replica knows, so it is read in the background (never per
request) and kept as a correction: what the replica held beyond the router's own at that read.
A replica that says it is not ready (draining, loading), or that could not be reached, is left
out of picks until a reading says otherwise, which is sooner than its EndpointSlice changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson

from batchd.router.directory import DeploymentRef
from batchd.router.metrics import RouterMetrics
from batchd.router.picker import estimated_items

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Reading:
    """One `GET /load` answer: the replica's queued and running items, and the router's own
    requests in flight to it at that moment."""

    items: int
    own_at_read: int
    ready: bool


def parse_load(body: bytes) -> tuple[int, bool]:
    """(queued + running items, ready) from a replica's `GET /load` JSON; ValueError if malformed."""
    document = orjson.loads(body)
    if not isinstance(document, dict):
        raise ValueError(f"expected a JSON object, got {type(document).__name__}")
    items = 0
    for field in ("queued_items", "running_items"):
        value = document.get(field)
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{field}: expected a count, got {value!r}")
        items += value
    return items, document.get("ready") is not False


class Loads:
    """Per replica (`host:port`): the router's own requests in flight and the last reading."""

    def __init__(self) -> None:
        self.inflight: dict[str, int] = {}
        self.readings: dict[str, Reading] = {}

    def items(self, replica: str) -> float:
        reading = self.readings.get(replica)
        own = self.inflight.get(replica, 0)
        if reading is None:
            return float(own)
        return estimated_items(own, reading.items, reading.own_at_read)

    def ready(self, replica: str) -> bool:
        reading = self.readings.get(replica)
        return reading is None or reading.ready

    def begin(self, replica: str) -> None:
        self.inflight[replica] = self.inflight.get(replica, 0) + 1

    def end(self, replica: str) -> None:
        left = self.inflight.get(replica, 1) - 1
        if left:
            self.inflight[replica] = left
        else:
            self.inflight.pop(replica, None)

    def record(self, replica: str, items: int, ready: bool) -> None:
        self.readings[replica] = Reading(items, self.inflight.get(replica, 0), ready)

    def unreachable(self, replica: str) -> None:
        """No connection could be opened: left out of picks until a `GET /load` answers again."""
        reading = self.readings.get(replica)
        self.readings[replica] = Reading(
            reading.items if reading else 0, self.inflight.get(replica, 0), False
        )

    def forget_except(self, replicas: set[str]) -> None:
        for gone in set(self.readings) - replicas:
            del self.readings[gone]


class LoadPoller:
    """Reads every known replica's `GET /load` every `interval_s`, all at once, each bounded."""

    def __init__(
        self,
        loads: Loads,
        replicas: Callable[[], dict[str, DeploymentRef]],
        session: aiohttp.ClientSession,
        metrics: RouterMetrics,
        *,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self.loads = loads
        self.replicas = replicas
        self.session = session
        self.metrics = metrics
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._shown: dict[str, DeploymentRef] = {}

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)

    async def poll_once(self) -> None:
        replicas = self.replicas()
        self.loads.forget_except(set(replicas))
        await asyncio.gather(*(self._read(replica) for replica in replicas))
        for replica, ref in replicas.items():
            self.metrics.replica_load.labels(ref.namespace, ref.name, replica).set(self.loads.items(replica))
        for replica, ref in self._shown.items():
            if replica not in replicas:
                with contextlib.suppress(KeyError):
                    self.metrics.replica_load.remove(ref.namespace, ref.name, replica)
        self._shown = replicas

    async def _read(self, replica: str) -> None:
        try:
            async with self.session.get(f"http://{replica}/load", timeout=self.timeout) as response:
                if response.status != 200:
                    raise ValueError(f"status {response.status}")
                items, ready = parse_load(await response.read())
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            logger.debug("GET /load from %s: %s", replica, error)
            return  # the last reading stands; the EndpointSlice says whether the replica is gone
        self.loads.record(replica, items, ready)
