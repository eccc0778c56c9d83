"""SIGTERM to a real router process: unready at once, no accepted request lost under a keep-alive
load, held requests answered 503 + Retry-After at the drain bound, and exit status 0."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from batchd.testing.closed_loop import connection_tracing
from batchd.testing.manifests import manifest
from batchd.testing.servers import replica_process, write_manifest

pytestmark = pytest.mark.slow

URL = "{router}/v1/models/adder:predict"
CLIENTS = 12


async def keep_alive_load(url: str, outcomes: Counter[str], answered: asyncio.Event) -> None:
    """Clients on one keep-alive pool sending back to back until the router takes no connection."""
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trace_configs=[connection_tracing()]
    ) as session:

        async def client() -> None:
            while True:
                request = SimpleNamespace(new_connection=False)
                try:
                    async with session.post(
                        url, json={"instances": [1]}, trace_request_ctx=request
                    ) as response:
                        await response.read()
                        closing = response.headers.get("Connection", "").lower() == "close"
                        outcomes[f"{response.status}" + (" + close" if closing else "")] += 1
                        if sum(outcomes.values()) >= 100:
                            answered.set()
                except (aiohttp.ClientError, OSError) as error:
                    if isinstance(error, aiohttp.ClientConnectorError) or request.new_connection:
                        return  # a new connection the router did not take: a client goes elsewhere
                    outcomes[f"lost: {type(error).__name__}: {error}"] += 1
                    return

        await asyncio.gather(*(client() for _ in range(CLIENTS)))


async def test_sigterm_under_a_keep_alive_load_loses_nothing_and_exits_0(
    cluster: Any, tmp_path: Path
) -> None:
    adder = manifest(
        "adder",
        {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.02}},
        batching={"max_batch_size": 8, "batch_wait_timeout_s": 0.002},
    )
    with replica_process(write_manifest(tmp_path, adder), tmp_path / "replica", host=cluster.host) as replica:
        await cluster.deploy("adder", f"{replica.host}:{replica.port}")
        async with cluster.router() as router:
            outcomes: Counter[str] = Counter()
            answered = asyncio.Event()
            load = asyncio.create_task(keep_alive_load(URL.format(router=router.url), outcomes, answered))
            await asyncio.wait_for(answered.wait(), 60)
            router.process.send_signal(signal.SIGTERM)
            exit_status = await asyncio.to_thread(router.process.wait, 60)
            await asyncio.wait_for(load, 30)
    assert exit_status == 0, router.log_tail()
    assert not [key for key in outcomes if not key.startswith("200")], dict(outcomes)
    assert outcomes["200"] >= 100 and outcomes["200 + close"] > 0, dict(outcomes)


async def test_a_held_request_gets_503_with_retry_after_at_the_drain_bound(cluster: Any) -> None:
    await cluster.create_deployment("adder")  # no replica: requests are held
    async with cluster.router(drain_timeout_s=1) as router:
        connector = aiohttp.TCPConnector(limit=2)
        async with aiohttp.ClientSession(connector=connector) as client:
            assert (await client.get(f"{router.url}/readyz")).status == 200
            held = asyncio.ensure_future(client.post(URL.format(router=router.url), json={"instances": [1]}))

            async def holding() -> bool:
                async with client.get(f"{cluster.admin_url}/held") as response:
                    return bool((await response.json())["deployments"])

            await cluster.eventually(holding, what="the request held")
            started = time.monotonic()
            router.process.send_signal(signal.SIGTERM)
            answer = await asyncio.wait_for(held, 30)
            body = await answer.json()
            waited = time.monotonic() - started
        exit_status = await asyncio.to_thread(router.process.wait, 30)
    assert answer.status == 503, body
    assert answer.headers["Retry-After"] == "5" and answer.headers["Connection"] == "close"
    assert body["error"] == ("model 'adder': the router is shutting down and no replica became ready; retry")
    assert 0.9 <= waited < 10  # at the drain bound, not at the hold's own 30 s
    assert exit_status == 0, router.log_tail()
