"""What a replica tells a router, and what it reads from one, on a real `batchd serve` process.

A 503 for a request the replica refused before accepting it (queue full, draining) says so with
`batchd-refused: <reason>`, so that a router may send it to another replica; an answer to an
accepted request never does (see test_composition for a callee's failures). `batchd-timeout-s`,
the time the client still waits, bounds the request when it is shorter than `request_timeout_s`.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from batchd.testing import manifests
from batchd.testing.servers import ServerProcess, replica_process, wait_until, write_manifest

pytestmark = pytest.mark.slow

BATCH_S = 2.0  # one batch of one item at a time, each this long: easy to fill, slower than a deadline
PREDICT = "/v1/models/tight:predict"


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("tight")
    with replica_process(write_manifest(directory, manifests.tight(BATCH_S)), directory) as server:
        yield server


async def test_a_full_queue_refuses_with_the_refused_header(tight: ServerProcess) -> None:
    wait_until(lambda: tight.idle(), 10, "tight idle")
    async with httpx.AsyncClient(base_url=tight.url, timeout=30) as client:
        running = asyncio.ensure_future(client.post(PREDICT, json={"instances": [1]}))
        await asyncio.to_thread(wait_until, lambda: tight.load()["running_items"] == 1, 5, "tight busy")
        queued = asyncio.ensure_future(client.post(PREDICT, json={"instances": [2]}))
        await asyncio.to_thread(wait_until, lambda: tight.load()["queued_items"] == 1, 5, "tight full")
        refused = await client.post(PREDICT, json={"instances": [3]})
        accepted = await asyncio.gather(running, queued)
    assert refused.status_code == 503, refused.text
    assert refused.headers["batchd-refused"] == "queue_full"
    assert int(refused.headers["retry-after"]) >= 1
    assert [answer.status_code for answer in accepted] == [200, 200]
    assert all("batchd-refused" not in answer.headers for answer in accepted)


async def test_the_clients_timeout_header_bounds_the_request(tight: ServerProcess) -> None:
    wait_until(lambda: tight.idle(), 10, "tight idle")
    async with httpx.AsyncClient(base_url=tight.url, timeout=30) as client:
        started = time.monotonic()
        late = await client.post(PREDICT, json={"instances": [1]}, headers={"batchd-timeout-s": "0.3"})
        elapsed = time.monotonic() - started
        assert late.status_code == 504, late.text
        assert "batchd-timeout-s passed" in late.json()["error"]
        assert "batchd-refused" not in late.headers  # it was accepted, then given up
        assert elapsed < BATCH_S  # not request_timeout_s, not the batch's time
        # A longer time than the batch takes is no bound: the answer comes as usual.
        await asyncio.to_thread(wait_until, lambda: tight.idle(), 10, "tight idle")
        answer = await client.post(PREDICT, json={"instances": [1]}, headers={"batchd-timeout-s": "20"})
        assert answer.status_code == 200 and answer.json()["predictions"] == [2]


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf", "nan"])
async def test_a_bad_timeout_header_is_a_400_naming_it_and_the_value(
    tight: ServerProcess, value: str
) -> None:
    async with httpx.AsyncClient(base_url=tight.url, timeout=30) as client:
        answer = await client.post(PREDICT, json={"instances": [1]}, headers={"batchd-timeout-s": value})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == (
        f"header batchd-timeout-s: expected a positive number of seconds, got {value!r}"
    )


async def test_a_draining_replica_refuses_with_the_refused_header(tmp_path: Path) -> None:
    with replica_process(write_manifest(tmp_path, manifests.tight(BATCH_S)), tmp_path) as replica:
        # Two keep-alive connections opened before SIGTERM: one to see the replica turn unready,
        # one to send work once it has (a draining replica takes no new connections).
        async with (
            httpx.AsyncClient(base_url=replica.url, limits=httpx.Limits(max_connections=1)) as watcher,
            httpx.AsyncClient(base_url=replica.url, limits=httpx.Limits(max_connections=1)) as sender,
        ):
            assert (await watcher.get("/v2/health/ready")).status_code == 200
            assert (await sender.get("/v2/health/ready")).status_code == 200
            replica.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while (await watcher.get("/v2/health/ready")).status_code == 200:
                assert time.monotonic() < deadline, "the replica did not turn unready after SIGTERM"
                await asyncio.sleep(0.02)
            refused = await sender.post(PREDICT, json={"instances": [1]})
        assert await asyncio.to_thread(replica.process.wait, 30) == 0
    assert refused.status_code == 503, refused.text
    assert refused.headers["batchd-refused"] == "draining"
    assert refused.headers["connection"] == "close"
