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
CLASSES = {
    "priority_classes": [
        {"name": "search", "priority": 10},
        {"name": "batch", "priority": 0},
        {"name": "prefetch", "priority": -1},
    ],
    "default_priority_class": "batch",
}


async def held(client: aiohttp.ClientSession, cluster: Any) -> list[dict[str, Any]]:
    async with client.get(f"{cluster.admin_url}/held") as response:
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
            lambda: _with_count(held(client, cluster), 3), what="three requests held"
        )
        assert entries[0]["namespace"] == cluster.namespace and entries[0]["model"] == "adder"
        assert first.received == 0
        await cluster.put_slice(cluster.slice("adder", [first.address], ready=True))
        answers = await asyncio.gather(*waiting)
        assert [status for status, _, _ in answers] == [200] * 3
        assert first.received == 3
        assert await held(client, cluster) == []
        async with client.get(f"{cluster.admin_url}/metrics") as response:
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
        await cluster.eventually(lambda: _with_count(held(client, cluster), 1), what="one request held")
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
        await cluster.eventually(lambda: _with_count(held(client, cluster), 1), what="one request held")
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
        await cluster.eventually(lambda: _with_count(held(client, cluster), 1), what="one request held")
        waiting.cancel()  # closes its connection
        await asyncio.gather(waiting, return_exceptions=True)
        await cluster.eventually(lambda: _empty(held(client, cluster)), what="the request no longer held")


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


async def test_a_request_of_an_unknown_class_is_refused_by_the_router_and_wakes_nothing(cluster: Any) -> None:
    await cluster.create_deployment("adder", batching=CLASSES)  # at zero replicas: no slice
    expected = "model 'adder': priority class: expected one of search, batch, prefetch, got 'urgent'"
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        url = URL.format(router=router.url)
        async with client.post(
            url, json={"instances": [1]}, headers={"batchd-priority": "urgent"}
        ) as response:
            assert (response.status, await response.json()) == (400, {"error": expected})
        embeddings = {"model": "adder", "input": "hi", "metadata": {"priority": "urgent"}}
        async with client.post(f"{router.url}/v1/embeddings", json=embeddings) as response:
            assert (response.status, await response.json()) == (400, {"error": expected})
        assert await held(client, cluster) == []  # what the operator reads to start a replica
        async with client.get(f"{cluster.admin_url}/metrics") as response:
            assert "batchd_router_holds_total{" not in await response.text()  # nothing was ever held


async def test_the_class_an_openai_body_names_is_the_one_the_router_holds_it_in(cluster: Any) -> None:
    await cluster.create_deployment("adder", batching=CLASSES)
    async with (
        cluster.router(max_held_per_deployment=2) as router,
        aiohttp.ClientSession() as client,
    ):
        waiting = asyncio.create_task(predict(client, router.url))  # the default class
        await cluster.eventually(lambda: _with_count(held(client, cluster), 1), what="one request held")
        # The hold is at half its bound: a sheddable class is refused, named in the body only ...
        sheddable = {"model": "adder", "input": "hi", "metadata": {"priority": "Prefetch"}}
        async with client.post(f"{router.url}/v1/embeddings", json=sheddable) as response:
            assert response.status == 503
            assert "a sheddable class is held only while fewer than 1 do" in (await response.json())["error"]

        # ... unless the header names another class: the header wins.
        async def headed() -> int:
            headers = {"batchd-priority": "search"}
            async with client.post(
                f"{router.url}/v1/embeddings", json=sheddable, headers=headers
            ) as response:
                return response.status

        searching = asyncio.create_task(headed())
        await cluster.eventually(lambda: _with_count(held(client, cluster), 2), what="two requests held")
        await cluster.delete_deployment("adder")
        assert await searching == 404 and (await waiting)[0] == 404
