"""One replica at `times` its capacity: the traffic, its memory meanwhile, and the recovery after."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from batchd.bench.kit import procstat
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.stats import p99_ms
from batchd.testing import servers
from batchd.testing.manifests import manifest
from batchd.testing.traffic import Traffic, unanswered

BATCH_S = 0.1
MAX_BATCH = 4
CAPACITY = MAX_BATCH / BATCH_S  # items a second
WARMUP_S = 5.0


def replica_manifest() -> dict[str, Any]:
    model = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": BATCH_S}}
    batching = {
        "max_batch_size": MAX_BATCH,
        "batch_wait_timeout_s": 0.01,
        "max_queued_requests": int(CAPACITY),  # about a second of work
    }
    return manifest("overload", model, batching=batching)


async def _recovery_s(url: str, timeout_s: float = 10.0) -> float:
    """From the end of the load until a request is answered 200 in under a second."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
        while time.monotonic() - started < timeout_s:
            sent = time.monotonic()
            response = await client.post("/v1/models/overload:predict", json={"instances": [1]})
            if response.status_code == 200 and time.monotonic() - sent < 1.0:
                return time.monotonic() - started
            await asyncio.sleep(0.02)
    return float("inf")


@dataclass(frozen=True)
class Overload:
    """What one overload run measured."""

    capacity_items_per_s: float
    offered_rate_per_s: float
    duration_s: float
    requests: int
    statuses: dict[str, int]  # answers by HTTP status ("None": no answer at all)
    served_per_s: float
    unanswered: int  # neither a 2xx nor a 503/429 with Retry-After
    refusals_without_retry_after: int
    rss_mib_min: float  # after the warm-up
    rss_mib_max: float
    rss_growth: float  # max / min - 1
    recovery_s: float  # from the end of the load until a request is answered 200 within a second
    p99_served_ms: float
    meta: RunRecord | None = None  # how it was run


@dataclass(frozen=True)
class Options:
    duration_s: float = 60.0  # of overload
    times: float = 10.0  # the load, as a multiple of capacity


QUICK = Options(duration_s=10.0)


async def run(duration_s: float, times: float, workdir: Path) -> Overload:
    path = servers.write_manifest(workdir, replica_manifest())
    with servers.replica_process(path, workdir) as replica:
        rate = CAPACITY * times
        traffic = Traffic(lambda: [replica.url], "/v1/models/overload:predict", b'{"instances": [1]}', rate)
        async with procstat.Sampler(replica.pid, 0.5) as memory:
            outcomes = await traffic.run(duration_s)
        recovery_s = await _recovery_s(replica.url)
        replica.check_alive()
    statuses = Counter(str(outcome.status) for outcome in outcomes)
    without_retry_after = sum(1 for o in outcomes if o.status in (429, 503) and o.retry_after is None)
    rss = [(at, taken.rss_bytes) for at, taken in memory.samples]
    steady = [bytes_ for at, bytes_ in rss if at >= WARMUP_S] or [bytes_ for _, bytes_ in rss]
    served = statuses.get("200", 0)
    return Overload(
        capacity_items_per_s=CAPACITY,
        offered_rate_per_s=rate,
        duration_s=duration_s,
        requests=len(outcomes),
        statuses=dict(statuses),
        served_per_s=served / duration_s,
        unanswered=len(unanswered(outcomes)),
        refusals_without_retry_after=without_retry_after,
        rss_mib_min=min(steady) / 2**20,
        rss_mib_max=max(steady) / 2**20,
        rss_growth=max(steady) / min(steady) - 1,
        recovery_s=recovery_s,
        p99_served_ms=p99_ms([o.latency_s for o in outcomes if o.status == 200]),
    )
