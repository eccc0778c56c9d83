"""Model composition through the router: a composer replica's handle calls a real router, which
picks the callee deployment by the model name in the path, as a client's request would.

`callee` doubles numbers; `tight` holds one batch of one item for seconds with room for one
more, so it is easy to fill. The composer (`Relay`) reaches both at the router's URL.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchd.testing import manifests
from batchd.testing.manifests import manifest
from batchd.testing.servers import (
    ServerProcess,
    batchd_command,
    running,
    start_process,
    start_replica,
    wait_until,
    write_manifest,
)

pytestmark = pytest.mark.slow

TIGHT_BATCH_S = 3.0


@dataclass
class Composed:
    router: ServerProcess
    router_admin: str  # the router's admin port, where its /metrics is
    callee: ServerProcess
    tight: ServerProcess
    composer: ServerProcess

    @property
    def predict(self) -> str:
        return f"{self.composer.url}/v1/models/composer:predict"


@pytest.fixture
async def composed(cluster: Any, tmp_path: Path) -> AsyncIterator[Composed]:
    callee = manifests.doubler("callee", batch_wait_timeout_s=0.02)
    tight = manifests.tight(TIGHT_BATCH_S)
    composer = manifest(
        "composer",
        {"handler": "batchd.testing.batch_handlers:Relay", "calls": {"callee": "callee", "tight": "tight"}},
        batching={"max_batch_size": 1, "max_concurrent_batches": 32},
    )
    callees = [
        start_replica(write_manifest(tmp_path, document), tmp_path / "logs", host=cluster.host)
        for document in (callee, tight)
    ]
    with running(callees):
        for replica in callees:
            await cluster.deploy(replica.name, f"{replica.host}:{replica.port}")
        async with cluster.router() as router:
            # As the operator writes them: the router's URL scoped to each callee deployment.
            calls = [
                f"--call={alias}={router.url}/deployments/{cluster.namespace}/{alias}"
                for alias in ("callee", "tight")
            ]
            command = [*batchd_command(), "serve", str(write_manifest(tmp_path, composer)), *calls]
            with running([start_process("composer", command, tmp_path / "logs")]) as (composer_process,):
                yield Composed(router, cluster.admin_url, callees[0], callees[1], composer_process)


def counter(server: ServerProcess | str, name: str, **labels: str) -> float:
    """The sum of a counter's series whose labels include `labels` (of a replica, or of the
    metrics at a router's admin URL)."""
    text = server.metrics() if isinstance(server, ServerProcess) else httpx.get(f"{server}/metrics").text
    total = 0.0
    for found_labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if all(f'{key}="{wanted}"' in found_labels for key, wanted in labels.items()):
            total += float(value)
    return total


async def test_a_composers_calls_reach_the_callee_through_the_router(composed: Composed) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        answers = await asyncio.gather(
            *(
                client.post(composed.predict, json={"instances": [{"to": "callee", "n": n}]})
                for n in range(16)
            )
        )
    assert [(answer.status_code, answer.json()) for answer in answers] == [
        (200, {"predictions": [2 * n]}) for n in range(16)
    ]
    assert counter(composed.callee, "batchd_requests_total", outcome="success") == 16
    routed = counter(composed.router_admin, "batchd_router_requests_total", deployment="callee", code="2xx")
    # Every call went through the router; its read of the callee's model name (GET /v1/models) is
    # no inference route, so the router answers it 404 and the handle takes the deployment's name.
    assert routed == 16


async def test_a_refusal_the_router_could_not_place_is_not_sent_again_by_the_handle(
    composed: Composed,
) -> None:
    tight = composed.tight
    load = f"{tight.url}/load"
    async with httpx.AsyncClient(timeout=30) as client:
        # One call holds tight's model, a second fills its one place in the queue (directly) ...
        direct = f"{tight.url}/v1/models/tight:predict"
        # One at a time: sent together, the second could find the first still queued, and be refused.
        busy = [asyncio.ensure_future(client.post(direct, json={"instances": [0]}))]
        await asyncio.to_thread(
            wait_until, lambda: httpx.get(load).json()["running_items"] == 1, 10, "tight busy"
        )
        busy.append(asyncio.ensure_future(client.post(direct, json={"instances": [1]})))
        await asyncio.to_thread(
            wait_until, lambda: httpx.get(load).json()["queued_items"] == 1, 10, "tight full"
        )
        # ... so the composer's call is refused: the router has no other replica to try.
        refused = await client.post(composed.predict, json={"instances": [{"to": "tight", "n": 1}]})
        await asyncio.gather(*busy)
    assert refused.status_code == 503, refused.text
    assert "callee 'tight' (BatchedDeployment 'tight') answered 503" in refused.json()["error"]
    assert "batchd-refused" not in refused.headers
    # tight saw the call once: neither the router nor the handle sent it again.
    assert counter(tight, "batchd_rejections_total", reason="queue_full") == 1
