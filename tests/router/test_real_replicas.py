"""The router in front of real `batchd serve` replicas: load spreads under a keep-alive client, and
a replica killed mid-load loses only what it had accepted.

kube-proxy balances connections: a client with a keep-alive pool sends most of its requests to
whichever pod its connections landed on (84% to one of four, measured through a connection-balancing proxy).
The router picks a replica per request.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from batchd.testing.manifests import manifest
from batchd.testing.servers import ServerProcess, running, start_replica, write_manifest

pytestmark = pytest.mark.slow

URL = "{router}/v1/models/slow:predict"
# 160 items/s a replica at full batches, the scenario's slow adder.
SLOW = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.05}}
BATCHING = {"max_batch_size": 8, "batch_wait_timeout_s": 0.005, "max_queued_requests": 256}


@pytest.fixture
def replicas(cluster: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[ServerProcess]]:
    """`count` (the test's parameter, default 3) ready replicas of the slow adder."""
    count = getattr(request, "param", 3)
    path = write_manifest(tmp_path, manifest("slow", SLOW, batching=BATCHING))
    started = [
        start_replica(path, tmp_path / "logs", name=f"slow-{n}", host=cluster.host) for n in range(count)
    ]
    try:
        for replica in started:
            replica.wait_ready(180)
        yield started
    finally:
        for replica in started:
            if replica.process.poll() is None:
                replica.process.kill()
                replica.process.wait(timeout=30)


def served(replica: ServerProcess) -> int:
    """Requests the replica answered with success, from its own metrics."""
    text = httpx.get(f"{replica.url}/metrics", timeout=5).text
    return sum(
        int(float(value))
        for value in re.findall(r'^batchd_requests_total\{[^}]*outcome="success"[^}]*\} (\S+)$', text, re.M)
    )


async def closed_loop(url: str, count: int, connections: int, on_answer: Any = None) -> list[int]:
    """`connections` workers on a keep-alive pool, each sending its next request when its last one
    is answered, `count` requests in all; the statuses in the order they were sent."""
    statuses: list[int] = [0] * count
    next_index = iter(range(count))
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:

        async def worker() -> None:
            for n in next_index:
                async with client.post(url, json={"instances": [n]}) as response:
                    await response.read()
                    statuses[n] = response.status
                if on_answer is not None:
                    await on_answer(statuses)

        await asyncio.gather(*(worker() for _ in range(connections)))
    return statuses


async def add_replicas(cluster: Any, replicas: list[ServerProcess]) -> None:
    await cluster.deploy("slow", *(f"{replica.host}:{replica.port}" for replica in replicas))


async def test_a_keep_alive_client_is_spread_over_every_replica(
    cluster: Any, replicas: list[ServerProcess]
) -> None:
    await add_replicas(cluster, replicas)
    async with cluster.router() as router:
        statuses = await closed_loop(URL.format(router=router.url), 360, connections=12)
    assert statuses == [200] * 360
    shares = [served(replica) / 360 for replica in replicas]
    # An even spread is a third each; kube-proxy under this client gives one pod most of it.
    assert all(0.2 < share < 0.47 for share in shares), shares


@pytest.mark.parametrize("replicas", [2], indirect=True)
async def test_a_replica_killed_mid_load_loses_only_what_it_had_accepted(
    cluster: Any, replicas: list[ServerProcess]
) -> None:
    await add_replicas(cluster, replicas)
    doomed, survivor = replicas
    connections = 12

    async def kill_after_some(statuses: list[int]) -> None:
        if doomed.process.poll() is None and sum(status != 0 for status in statuses) >= 60:
            doomed.process.kill()  # SIGKILL: no drain, its connections reset

    async with cluster.router() as router:
        statuses = await closed_loop(URL.format(router=router.url), 400, connections, kill_after_some)
        async with aiohttp.ClientSession() as client, client.get(f"{cluster.admin_url}/metrics") as response:
            metrics = await response.text()
    assert doomed.process.poll() is not None
    assert set(statuses) <= {200, 502}
    # What the dead replica held when it died is lost (at most one request per connection); a
    # request that found it dead was never sent to it and went to the survivor.
    assert statuses.count(502) <= connections
    assert statuses[-200:] == [200] * 200
    assert served(survivor) >= 200  # at least the last 200, sent once the other was dead
    retried = re.findall(
        r'^batchd_router_retries_total\{[^}]*reason="unreachable"[^}]*\} (\S+)$', metrics, re.M
    )
    assert retried and float(retried[0]) >= 1


async def test_a_request_a_full_replica_refused_is_answered_by_another(cluster: Any, tmp_path: Path) -> None:
    """`full` holds one batch and one queued item for seconds; `free` answers at once. The router
    learns no load from `GET /load` in this test (polled once an hour), so about half the requests
    go to `full` first: it refuses each with `batchd-refused`, and the router sends it to `free`."""
    full_model = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 5.0}}
    one_at_a_time = {"max_batch_size": 1, "max_queued_requests": 1, "batch_wait_timeout_s": 0}
    full_path = write_manifest(tmp_path / "full", manifest("slow", full_model, batching=one_at_a_time))
    free_path = write_manifest(tmp_path / "free", manifest("slow", {**SLOW, "init_kwargs": {"delay_s": 0}}))
    full, free = (
        start_replica(path, tmp_path / "logs", name=path.parent.name, host=cluster.host)
        for path in (full_path, free_path)
    )
    with running([full, free]):
        await add_replicas(cluster, [full, free])
        async with (
            cluster.router(load_poll_interval_s=3600) as router,
            httpx.AsyncClient(timeout=30) as client,
        ):
            direct = f"{full.url}/v1/models/slow:predict"
            # One request in the model, then one in its queue: sent together, the second could
            # find the first still queued, and be refused.
            busy = [asyncio.ensure_future(client.post(direct, json={"instances": [0]}))]
            await cluster.eventually(lambda: full.load()["running_items"] == 1, what="full's model busy")
            busy.append(asyncio.ensure_future(client.post(direct, json={"instances": [1]})))
            await cluster.eventually(lambda: full.load()["queued_items"] == 1, what="full's queue full")
            answers = [
                await client.post(URL.format(router=router.url), json={"instances": [n]}) for n in range(10)
            ]
            metrics = (await client.get(f"{cluster.admin_url}/metrics")).text
            await asyncio.gather(*busy)
        full_metrics = full.metrics()
    assert [(answer.status_code, answer.json()) for answer in answers] == [
        (200, {"predictions": [n + 1]}) for n in range(10)
    ]
    retried = re.findall(r'^batchd_router_retries_total\{[^}]*reason="refused"[^}]*\} (\S+)$', metrics, re.M)
    # Each request drew `full` first with even odds: none doing so in ten is a 1-in-1024 chance.
    assert retried and float(retried[0]) >= 1, metrics
    refused_by_full = re.findall(
        r'^batchd_rejections_total\{[^}]*reason="queue_full"[^}]*\} (\S+)$', full_metrics, re.M
    )
    assert float(refused_by_full[0]) == float(retried[0])  # each refusal retried once, none twice
