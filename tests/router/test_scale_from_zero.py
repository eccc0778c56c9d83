"""At zero ready replicas the router holds requests, bounded, and says what it holds.

The operator reads `GET /held` to start a first replica; the requests go to it once its endpoint
is ready. Past the bounds a client gets 503 with Retry-After; a deployment deleted meanwhile
fails its held requests naming the model.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

URL = "{router}/v1/models/adder:predict"


async def held(client: aiohttp.ClientSession, router: str) -> list[dict[str, Any]]:
    async with client.get(f"{router}/held") as response:
        assert response.status == 200
        deployments: list[dict[str, Any]] = (await response.json())["deployments"]
        return deployments


async def predict(client: aiohttp.ClientSession, router: str) -> tuple[int, dict[str, Any], Any]:
    async with client.post(URL.format(router=router), json={"instances": [1]}) as response:
        return response.status, await response.json(), response.headers.get("retry-after")


async def test_held_requests_go_to_the_first_replica_that_is_ready(cluster: Any, fakes: Any) -> None:
    first = fakes("ok")
    await cluster.create_deployment("adder")
    await cluster.put_slice(cluster.slice("adder", [first.address], ready=False))  # starting
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        waiting = [asyncio.create_task(predict(client, router.url)) for _ in range(3)]
        entries = await cluster.eventually(
            lambda: _with_count(held(client, router.url), 3), what="three requests held"
        )
        assert entries[0]["namespace"] == cluster.namespace and entries[0]["model"] == "adder"
        assert first.received == 0
        await cluster.put_slice(cluster.slice("adder", [first.address], ready=True))
        answers = await asyncio.gather(*waiting)
        assert [status for status, _, _ in answers] == [200] * 3
        assert first.received == 3
        assert await held(client, router.url) == []
        async with client.get(f"{router.url}/metrics") as response:
            assert (
                f'batchd_router_cold_starts_total{{deployment="adder",namespace="{cluster.namespace}"}} 3.0'
                in (await response.text())
            )


async def test_past_the_bounds_a_client_is_told_to_retry_later(cluster: Any) -> None:
    await cluster.create_deployment("adder")
    async with (
        cluster.router(max_held_per_deployment=1, hold_timeout_s=2, hold_retry_after_s=7) as router,
        aiohttp.ClientSession() as client,
    ):
        waiting = asyncio.create_task(predict(client, router.url))
        await cluster.eventually(lambda: _with_count(held(client, router.url), 1), what="one request held")
        status, body, retry_after = await predict(client, router.url)
        assert (status, retry_after) == (503, "7")
        assert body == {
            "error": "model 'adder': no replica is ready and 1 requests already wait for one; retry later"
        }
        status, body, retry_after = await waiting
        assert (status, retry_after) == (503, "7")
        assert body == {"error": "model 'adder': no replica became ready within 2 s; retry later"}


async def test_a_deployment_deleted_while_requests_wait_fails_them_naming_the_model(cluster: Any) -> None:
    await cluster.create_deployment("adder")
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        waiting = asyncio.create_task(predict(client, router.url))
        await cluster.eventually(lambda: _with_count(held(client, router.url), 1), what="one request held")
        await cluster.delete_deployment("adder")
        status, body, _ = await waiting
        assert status == 404
        assert body == {
            "error": f"model 'adder': its BatchedDeployment {cluster.namespace}/adder was deleted"
        }
        status, body, _ = await predict(client, router.url)
        assert (status, body) == (404, {"error": "model 'adder': no BatchedDeployment serves it"})


async def _with_count(entries: Any, count: int) -> list[dict[str, Any]] | None:
    found: list[dict[str, Any]] = await entries
    return found if found and found[0]["held_requests"] == count else None


async def test_a_client_that_leaves_stops_waiting(cluster: Any) -> None:
    await cluster.create_deployment("adder")
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        waiting = asyncio.create_task(predict(client, router.url))
        await cluster.eventually(lambda: _with_count(held(client, router.url), 1), what="one request held")
        waiting.cancel()  # closes its connection
        await asyncio.gather(waiting, return_exceptions=True)
        await cluster.eventually(lambda: _empty(held(client, router.url)), what="the request no longer held")


async def test_the_clients_deadline_bounds_the_hold_and_travels_to_the_replica(
    cluster: Any, fakes: Any
) -> None:
    await cluster.create_deployment("adder")
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        url = URL.format(router=router.url)
        async with client.post(url, json={"instances": [1]}, headers={"batchd-timeout-s": "0.3"}) as response:
            assert response.status == 504
            assert (await response.json())["error"] == (
                "model 'adder': the request's batchd-timeout-s passed while it waited for a first replica"
            )
        async with client.post(
            url, json={"instances": [1]}, headers={"batchd-timeout-s": "soon"}
        ) as response:
            assert response.status == 400
            assert (await response.json())["error"] == (
                "header batchd-timeout-s: expected a positive number of seconds, got 'soon'"
            )
        replica = fakes("ok")
        await cluster.put_slice(cluster.slice("adder", [replica.address]))
        await cluster.eventually(lambda: _answers(client, url), what="the replica reached")
        async with client.post(url, json={"instances": [1]}, headers={"batchd-timeout-s": "20"}) as response:
            assert response.status == 200
        assert 0 < float(replica.headers[-1][b"batchd-timeout-s"]) <= 20


async def _empty(entries: Any) -> bool:
    return bool(await entries == [])


async def _answers(client: aiohttp.ClientSession, url: str) -> bool:
    async with client.post(url, json={"instances": [1]}) as response:
        return response.status == 200
