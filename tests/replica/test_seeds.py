"""Ray Serve's batching tutorial, replayed against batchd: what the tutorial shows, a user sees here."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from batchd.testing import ROOT
from batchd.testing.promtext import parse_histogram
from batchd.testing.servers import replica_process, wait_until

pytestmark = pytest.mark.slow


def batches_dispatched(url: str) -> float:
    return parse_histogram(httpx.get(f"{url}/metrics").text, "batchd_batch_size").count


async def test_the_adder_runs_a_batch_of_one_then_full_batches_of_four(tmp_path: Path) -> None:
    # "As you can see, the first batch has a batch size of 1, and the subsequent queries have a
    # batch size of 4." The adder sleeps 0.2 s a batch, so queries sent meanwhile queue up.
    with replica_process(ROOT / "examples" / "adder.yaml", tmp_path) as replica:
        async with httpx.AsyncClient(base_url=replica.url, timeout=60) as client:
            first = asyncio.ensure_future(client.get("/", params={"number": "0"}))
            await asyncio.to_thread(
                wait_until, lambda: batches_dispatched(replica.url) >= 1, 30, "first batch"
            )
            rest = [client.get("/", params={"number": str(n)}) for n in range(1, 9)]
            responses = await asyncio.gather(first, *rest)
        assert [r.json() for r in responses] == [n + 1 for n in range(9)]
        shapes = re.findall(r"Our input array has shape: \((\d+),\)", replica.log())
    assert shapes == ["1", "4", "4"]
