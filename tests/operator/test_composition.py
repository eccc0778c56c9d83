"""Model composition end to end: the operator wires a composer's handles to its callee's Service.

The real operator runs against the emulated API server; the stand-in cluster runs a real `batchd
serve` for every pod, resolves the Service URLs the operator puts in the composer's env to a
kube-proxy stand-in, and that sends each connection to a ready pod of the callee.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from batchd.bench.kit.promtext import parse_histogram
from batchd.testing import manifests
from batchd.testing.cluster import Cluster, PodView
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import api_server, create, eventually, running_operator

pytestmark = pytest.mark.slow

NS = "default"
START_S = 60.0


def ready(cluster: Cluster, name: str) -> list[PodView]:
    return [pod for pod in cluster.pods(name) if pod.ready and not pod.terminating]


async def test_a_composers_calls_reach_its_callees_service_and_are_batched_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHD_DRAIN_DELAY_S", "0")
    callee = manifests.doubler("doubler", batch_wait_timeout_s=0.05)
    composer = manifest(
        "relay",
        {"handler": "batchd.testing.batch_handlers:Relay", "calls": {"double": "doubler"}},
        batching={"max_batch_size": 1, "max_concurrent_batches": 32},
    )
    async with (
        api_server(tmp_path) as server,
        running_operator(server),
        Cluster(server, tmp_path / "cluster") as cluster,
    ):
        await create(server, composer)  # before its callee: an address resolves before its Service exists
        await create(server, callee)
        await eventually(
            lambda: len(ready(cluster, "relay")) == 1 and len(ready(cluster, "doubler")) == 1,
            timeout_s=START_S,
            what="both deployments ready",
        )
        # The operator told the composer where its callee's Service is ...
        deployment = server.get_object("apps/deployments", NS, "relay")
        assert deployment is not None
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert json.loads(env["BATCHD_CALLS"]) == {"double": "http://doubler.default.svc.cluster.local:8000"}

        # ... and the composer's requests, each calling the callee once, are batched by the callee.
        (relay,) = ready(cluster, "relay")
        (doubler,) = ready(cluster, "doubler")
        url = f"{relay.url}/v1/models/relay:predict"
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=48), timeout=30) as client:
            answers = await asyncio.gather(
                *(client.post(url, json={"instances": [{"to": "double", "n": n}]}) for n in range(48))
            )
            metrics = (await client.get(f"{doubler.url}/metrics")).text
        assert [answer.status_code for answer in answers] == [200] * 48, answers[0].text
        assert [answer.json()["predictions"] for answer in answers] == [[2 * n] for n in range(48)]
        batches = parse_histogram(metrics, "batchd_batch_size")
        assert batches.sum >= 48 and batches.mean > 2, batches.distribution()
        assert cluster.service_proxy(NS, "doubler", 8000).connections >= 1
