"""The router as a real process, its endpoints written to a real API server, fake replicas.

What a client notices: requests reach the deployment that serves their model; a replica's refusal
before accepting goes to another replica; nothing a replica may have accepted is sent twice;
answers stream through as they are made.
"""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

import aiohttp

from batchd.router.rbac import rbac_rules

PREDICT = "/v1/models/{model}:predict"


async def post_many(
    url: str, count: int, *, connections: int = 8, headers: dict[str, str] | None = None
) -> list[tuple[int, bytes]]:
    """`count` predictions over a keep-alive pool of `connections`, all at once."""
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as client:

        async def one(n: int) -> tuple[int, bytes]:
            async with client.post(url, json={"instances": [n]}, headers=headers) as response:
                return response.status, await response.read()

        return await asyncio.gather(*(one(n) for n in range(count)))


async def test_requests_reach_the_deployment_that_serves_their_model(cluster: Any, fakes: Any) -> None:
    adder, other = fakes("ok"), fakes("ok")
    await cluster.create_deployment("adder")
    await cluster.create_deployment("embedder", model="minilm")
    await cluster.put_slice(cluster.slice("adder", [adder.address]))
    await cluster.put_slice(cluster.slice("embedder", [other.address]))
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        for model, fake in (("adder", adder), ("minilm", other)):
            url = router.url + PREDICT.format(model=model)
            async with client.post(url, json={"instances": [1]}) as response:
                assert response.status == 200
                assert await response.json() == {"predictions": [int(fake.address.rpartition(":")[2])]}
        assert adder.bodies == [b'{"instances": [1]}']
        async with client.post(router.url + PREDICT.format(model="embedder"), json={}) as response:
            assert response.status == 404
            assert await response.json() == {"error": "model 'embedder': no BatchedDeployment serves it"}
        async with client.get(f"{router.url}/v2/models") as response:
            assert response.status == 404
            assert "no route for GET /v2/models" in (await response.json())["error"]
    # Everything it asked the API server is what its Role allows, and nothing more.
    allowed = {
        (rule["apiGroups"][0], rule["resources"][0], verb) for rule in rbac_rules() for verb in rule["verbs"]
    }
    assert await cluster.eventually(
        lambda: cluster.router_calls() == allowed, what="the router's calls audited"
    )


async def test_a_refused_request_goes_to_another_replica(cluster: Any, fakes: Any) -> None:
    refusing, accepting = fakes("refuse"), fakes("ok")
    await cluster.deploy("adder", refusing.address, accepting.address)
    async with cluster.router() as router:
        answers = await post_many(router.url + PREDICT.format(model="adder"), 40)
        metrics = await _metrics(cluster.admin_url)
    assert [status for status, _ in answers] == [200] * 40
    assert accepting.received == 40
    assert refusing.received > 0  # about half were tried there first
    assert f'reason="refused"}} {float(refusing.received)}' in metrics


async def test_a_sheddable_request_refused_by_a_replica_is_not_sent_to_another(
    cluster: Any, fakes: Any
) -> None:
    refusing, accepting = fakes("refuse"), fakes("ok")
    classes = [{"name": "default", "priority": 0}, {"name": "bulk", "priority": -1}]
    await cluster.deploy("adder", refusing.address, accepting.address, batching={"priority_classes": classes})
    async with cluster.router() as router:
        url = router.url + PREDICT.format(model="adder")
        shed = await post_many(url, 40, headers={"batchd-priority": "bulk"})
    statuses = [status for status, _ in shed]
    # Each went to one replica only: the refusing one's refusals are the answers.
    assert statuses.count(503) == refusing.received > 0
    assert statuses.count(200) == accepting.received == 40 - refusing.received


async def test_an_unreachable_replica_is_passed_over(cluster: Any, fakes: Any) -> None:
    accepting = fakes("ok")
    await cluster.deploy("adder", f"{cluster.host}:9", accepting.address)  # 9: the discard port, closed
    async with cluster.router() as router:
        answers = await post_many(router.url + PREDICT.format(model="adder"), 30)
        metrics = await _metrics(cluster.admin_url)
    assert [status for status, _ in answers] == [200] * 30
    assert accepting.received == 30
    assert 'reason="unreachable"' in metrics


async def test_an_unmarked_503_passes_through_and_is_not_sent_again(cluster: Any, fakes: Any) -> None:
    overloaded, accepting = fakes("overloaded"), fakes("ok")
    await cluster.deploy("adder", overloaded.address, accepting.address)
    async with cluster.router() as router:
        answers = await post_many(router.url + PREDICT.format(model="adder"), 40)
    statuses = [status for status, _ in answers]
    assert statuses.count(503) == overloaded.received > 0
    assert statuses.count(200) == accepting.received
    assert overloaded.received + accepting.received == 40


async def test_a_connection_lost_after_sending_is_a_502_and_not_sent_again(
    cluster: Any, fakes: Any, resetting: Any
) -> None:
    accepting = fakes("ok")
    await cluster.deploy("adder", resetting.address, accepting.address)
    async with cluster.router() as router:
        answers = await post_many(router.url + PREDICT.format(model="adder"), 40)
    failed = [body for status, body in answers if status == 502]
    assert len(failed) == resetting.received > 0
    assert b"not sent again" in failed[0]
    assert accepting.received + resetting.received == 40


async def test_server_sent_events_stream_through_as_they_are_made(cluster: Any, fakes: Any) -> None:
    streaming = fakes("stream")
    await cluster.deploy("gpt", streaming.address)
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        url = f"{router.url}/v2/models/gpt/generate_stream"
        async with client.post(url, json={"text_input": "hi"}) as response:
            assert response.status == 200
            assert response.headers["content-type"] == "text/event-stream"
            # The first event arrives while the replica still holds back the second.
            assert await response.content.readuntil(b"\n\n") == b'data: {"text_output": "one"}\n\n'
            streaming.go_on.set()
            assert await response.content.read() == b'data: {"text_output": "two"}\n\n'


async def _metrics(url: str) -> str:
    async with aiohttp.ClientSession() as client, client.get(f"{url}/metrics") as response:
        return await response.text()


async def test_large_bodies_pass_through_both_ways_whatever_their_framing(cluster: Any, fakes: Any) -> None:
    echo = fakes("echo")
    await cluster.deploy("adder", echo.address)
    body = bytes(range(256)) * (12 * 1024)  # 3 MiB: beyond what the router keeps for a retry

    async def pieces() -> Any:
        for start in range(0, len(body), 100_000):
            yield body[start : start + 100_000]

    async with cluster.router() as router, aiohttp.ClientSession() as client:
        url = router.url + PREDICT.format(model="adder")
        async with client.post(url, data=io.BytesIO(body)) as response:  # Content-Length
            assert response.status == 200
            assert await response.read() == body
        async with client.post(url, data=pieces()) as response:  # chunked
            assert response.status == 200
            assert await response.read() == body
    assert [len(received) for received in echo.bodies] == [len(body)] * 2


async def test_load_the_router_did_not_send_steers_requests_away(cluster: Any, fakes: Any) -> None:
    busy, idle, draining = fakes("ok"), fakes("ok"), fakes("ok")
    busy.load["queued_items"] = 1000  # another router's, or direct clients'
    draining.load["ready"] = False  # shutting down, still in the EndpointSlice
    await cluster.deploy("adder", busy.address, idle.address, draining.address)
    async with cluster.router(load_poll_interval_s=0.1) as router:

        async def busy_seen() -> bool:
            return f'replica="{busy.address}"}} 1000.0' in await _metrics(cluster.admin_url)

        await cluster.eventually(busy_seen, what="the router to read the busy replica's load")
        answers = await post_many(router.url + PREDICT.format(model="adder"), 40)
    assert [status for status, _ in answers] == [200] * 40
    assert (busy.received, idle.received, draining.received) == (0, 40, 0)


async def test_a_client_that_leaves_is_seen_leaving_by_the_replica(cluster: Any, fakes: Any) -> None:
    hanging = fakes("hang")
    await cluster.deploy("adder", hanging.address)
    async with cluster.router() as router:
        client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5))
        async with client:
            try:
                await client.post(router.url + PREDICT.format(model="adder"), json={"instances": [1]})
            except TimeoutError:
                pass  # the client gives up and closes its connection
            else:
                raise AssertionError("the hanging replica answered")
        await cluster.eventually(lambda: hanging.left == 1, what="the replica to see its client leave")
    assert hanging.received == 1


async def test_a_replica_that_closes_after_answering_gets_a_new_connection(cluster: Any, fakes: Any) -> None:
    closing = fakes("closing")
    await cluster.deploy("adder", closing.address)
    async with cluster.router() as router:
        answers = await post_many(router.url + PREDICT.format(model="adder"), 30, connections=1)
        metrics = await _metrics(cluster.admin_url)
    assert [status for status, _ in answers] == [200] * 30
    assert closing.received == 30
    assert "batchd_router_retries_total{" not in metrics  # each went on a fresh connection, first time


async def test_a_replica_that_does_not_answer_is_a_504_past_its_request_timeout(
    cluster: Any, fakes: Any
) -> None:
    hanging = fakes("hang")
    await cluster.create_deployment("adder", batching={"request_timeout_s": 0.5})
    await cluster.put_slice(cluster.slice("adder", [hanging.address]))
    async with cluster.router(answer_margin_s=0.2) as router, aiohttp.ClientSession() as client:
        url = router.url + PREDICT.format(model="adder")
        started = time.monotonic()
        async with client.post(url, json={"instances": [1]}) as response:
            waited = time.monotonic() - started
            error = (await response.json())["error"]
            assert response.status == 504, error
        assert 0.7 <= waited < 5  # request_timeout_s + answer_margin_s, not the client's patience
        assert f"replica {hanging.address} of {cluster.namespace}/adder did not answer within 0.7 s" in error
        # The client's own time left is the bound when it is shorter.
        started = time.monotonic()
        async with client.post(url, json={"instances": [1]}, headers={"batchd-timeout-s": "0.2"}) as response:
            assert response.status == 504
        assert time.monotonic() - started < 0.6
        await cluster.eventually(lambda: hanging.left == 2, what="the replica to see the router leave")
    assert hanging.received == 2  # each sent once, never again


async def test_a_deployment_named_in_the_path_is_reached_whatever_its_model_is_called(
    cluster: Any, fakes: Any
) -> None:
    mine, theirs = fakes("ok"), fakes("ok")
    await cluster.create_deployment("adder")
    await cluster.create_deployment("adder", namespace=cluster.second_namespace)
    await cluster.put_slice(cluster.slice("adder", [mine.address]))
    await cluster.put_slice(cluster.slice("adder", [theirs.address], namespace=cluster.second_namespace))
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        # By model name alone, two namespaces serve "adder": the router refuses to guess.
        async with client.post(router.url + PREDICT.format(model="adder"), json={}) as response:
            assert response.status == 409
        for namespace, fake in ((cluster.namespace, mine), (cluster.second_namespace, theirs)):
            url = f"{router.url}/deployments/{namespace}/adder" + PREDICT.format(model="adder")
            async with client.post(url, json={"instances": [1]}) as response:
                assert response.status == 200
                assert await response.json() == {"predictions": [int(fake.address.rpartition(":")[2])]}
        url = f"{router.url}/deployments/team-c/adder" + PREDICT.format(model="adder")
        async with client.post(url, json={}) as response:
            assert response.status == 404
            assert await response.json() == {"error": "deployment team-c/adder: no such BatchedDeployment"}
    assert (mine.received, theirs.received) == (1, 1)


async def test_only_inference_paths_of_a_deployment_named_in_the_path_are_forwarded(
    cluster: Any, fakes: Any
) -> None:
    replica = fakes("ok")
    await cluster.deploy("adder", replica.address)
    base = f"/deployments/{cluster.namespace}/adder"
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        for method, path in (
            ("GET", "/metrics"),
            ("GET", "/load"),
            ("GET", "/docs"),
            ("GET", "/openapi.json"),
            ("GET", "/held"),
            ("GET", "/v1/models"),
            ("POST", "/v2/models/../../metrics/infer"),
        ):
            async with client.request(method, router.url + base + path) as response:
                assert response.status == 404, path
                assert "inference routes only" in (await response.json())["error"]
        # The router's own admin pages are not on the clients' port either.
        for path in ("/metrics", "/held"):
            async with client.get(router.url + path) as response:
                assert response.status == 404, path
        async with client.post(router.url + base + PREDICT.format(model="adder"), json={}) as response:
            assert response.status == 200
    assert replica.received == 1


async def test_an_open_deployment_gets_the_class_granted_and_no_identity_the_client_wrote(
    cluster: Any, fakes: Any
) -> None:
    replica = fakes("ok")
    classes = [{"name": "search", "priority": 1}, {"name": "default", "priority": 0}]
    await cluster.deploy("adder", replica.address, batching={"priority_classes": classes})
    sent = {
        "batchd-priority": "search",
        "batchd-fairness-id": "caller-a",
        "batchd-tenant": "team-a",
        "batchd-called-by": "composer",
        "Authorization": "Bearer sk-secret",
    }
    url = PREDICT.format(model="adder")
    async with (
        cluster.router() as router,
        aiohttp.ClientSession() as client,
        client.post(router.url + url, json={"instances": [1]}, headers=sent) as answer,
    ):
        assert answer.status == 200
    seen = replica.headers[-1]
    # No access Secret yet: the class granted and the caller go unsigned, and nothing else.
    assert seen[b"batchd-priority"] == b"search"
    assert seen[b"batchd-fairness-id"] == b"caller-a"
    for header in (b"batchd-tenant", b"batchd-called-by", b"authorization", b"batchd-stamp"):
        assert header not in seen, header
