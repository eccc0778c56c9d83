"""SIGTERM under a keep-alive pool of a real client: every request that reached the replica on an
open connection gets an answer, never a reset; only new connections may be refused.

Repeated, because the failure this guards against is a race: a request written on an idle
keep-alive connection at the moment the server closes it.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest

from batchd.testing.closed_loop import connection_tracing
from batchd.testing.manifests import manifest
from batchd.testing.servers import replica_process, write_manifest

pytestmark = pytest.mark.slow

SIGTERMS = 8
CLIENTS = 24


async def hammer(url: str, stop: asyncio.Event) -> Counter[str]:
    """Clients that send back to back over a shared keep-alive pool until the replica is gone."""
    outcomes: Counter[str] = Counter()
    connector = aiohttp.TCPConnector(limit=CLIENTS, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trace_configs=[connection_tracing()]
    ) as session:

        async def client() -> None:
            while not stop.is_set():
                request = SimpleNamespace(new_connection=False)
                try:
                    async with session.post(
                        f"{url}/v1/models/drained:predict", json={"instances": [1]}, trace_request_ctx=request
                    ) as response:
                        await response.read()
                        if response.status == 200:
                            outcomes["200"] += 1
                        elif response.status == 503 and response.headers.get("Retry-After"):
                            closing = response.headers.get("Connection", "").lower() == "close"
                            outcomes["503 + Retry-After" + (" + close" if closing else "")] += 1
                        else:
                            outcomes[f"HTTP {response.status}"] += 1
                except (aiohttp.ClientError, OSError) as error:
                    if isinstance(error, aiohttp.ClientConnectorError):
                        outcomes["refused (new connection)"] += 1
                        return
                    if request.new_connection:
                        # Reset from the listener's accept queue as it closed: a new connection
                        # the replica never took. A real client goes elsewhere.
                        outcomes["reset in the accept queue (new connection)"] += 1
                        return
                    outcomes[f"lost: {type(error).__name__}: {error}"] += 1

        await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return outcomes


async def test_sigterm_under_a_keep_alive_pool_resets_nothing(tmp_path: Path) -> None:
    document = manifest(
        "drained",
        {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.01}},
        batching={"max_batch_size": 8, "batch_wait_timeout_s": 0.002},
    )
    path = write_manifest(tmp_path, document)
    totals: Counter[str] = Counter()
    for attempt in range(SIGTERMS):
        with replica_process(path, tmp_path / f"run-{attempt}") as replica:
            stop = asyncio.Event()
            load = asyncio.create_task(hammer(replica.url, stop))
            await asyncio.sleep(0.3 + 0.05 * attempt)  # vary the moment: the race is about timing
            replica.process.send_signal(signal.SIGTERM)
            exit_status = await asyncio.to_thread(replica.process.wait, 60)
            stop.set()
            outcomes = await load
            assert exit_status == 0, replica.log()
        totals += outcomes
        lost = {key: count for key, count in outcomes.items() if key.startswith(("lost", "HTTP"))}
        assert not lost, f"SIGTERM {attempt + 1}: {dict(outcomes)}"
    assert totals["200"] > 100 and totals["503 + Retry-After + close"] > 0, dict(totals)
