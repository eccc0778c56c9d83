"""The router as a real uvicorn process, endpoints fed by the emulated API server, fake replicas.

What a client notices: requests reach the deployment that serves their model; a replica's refusal
before accepting goes to another replica; nothing a replica may have accepted is sent twice;
answers stream through as they are made.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import Any

import aiohttp

from batchd.api.spec import GROUP, PLURAL, VERSION
from batchd.router.rbac import rbac_rules
from batchd.testing.manifests import manifest

PREDICT = "/v1/models/{model}:predict"


async def post_many(url: str, count: int, *, connections: int = 8) -> list[tuple[int, bytes]]:
    """`count` predictions over a keep-alive pool of `connections`, all at once."""
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as client:

        async def one(n: int) -> tuple[int, bytes]:
            async with client.post(url, json={"instances": [n]}) as response:
                return response.status, await response.read()

        return await asyncio.gather(*(one(n) for n in range(count)))


async def test_requests_reach_the_deployment_that_serves_their_model(stand_in: Any, fakes: Any) -> None:
    adder, other = fakes("ok"), fakes("ok")
    await stand_in.create_deployment("adder")
    await stand_in.create_deployment("embedder", model="minilm")
    await stand_in.put_slice(stand_in.slice("adder", [adder.address]))
    await stand_in.put_slice(stand_in.slice("embedder", [other.address]))
    async with stand_in.router() as router, aiohttp.ClientSession() as client:
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
    assert stand_in.server.router_calls == allowed


async def test_a_refused_request_goes_to_another_replica(stand_in: Any, fakes: Any) -> None:
    refusing, accepting = fakes("refuse"), fakes("ok")
    await stand_in.deploy("adder", refusing.address, accepting.address)
    async with stand_in.router() as router:
        answers = await post_many(router.url + PREDICT.format(model="adder"), 40)
        metrics = await _metrics(router.url)
    assert [status for status, _ in answers] == [200] * 40
    assert accepting.received == 40
    assert refusing.received > 0  # about half were tried there first
    assert f'reason="refused"}} {float(refusing.received)}' in metrics


async def test_an_unreachable_replica_is_passed_over(stand_in: Any, fakes: Any) -> None:
    accepting = fakes("ok")
    await stand_in.deploy("adder", "127.0.0.1:9", accepting.address)  # 9: the discard port, closed
    async with stand_in.router() as router:
        answers = await post_many(router.url + PREDICT.format(model="adder"), 30)
        metrics = await _metrics(router.url)
    assert [status for status, _ in answers] == [200] * 30
    assert accepting.received == 30
    assert 'reason="unreachable"' in metrics


async def test_an_unmarked_503_passes_through_and_is_not_sent_again(stand_in: Any, fakes: Any) -> None:
    overloaded, accepting = fakes("overloaded"), fakes("ok")
    await stand_in.deploy("adder", overloaded.address, accepting.address)
    async with stand_in.router() as router:
        answers = await post_many(router.url + PREDICT.format(model="adder"), 40)
    statuses = [status for status, _ in answers]
    assert statuses.count(503) == overloaded.received > 0
    assert statuses.count(200) == accepting.received
    assert overloaded.received + accepting.received == 40


async def test_a_connection_lost_after_sending_is_a_502_and_not_sent_again(
    stand_in: Any, fakes: Any, resetting: Any
) -> None:
    accepting = fakes("ok")
    await stand_in.deploy("adder", resetting.address, accepting.address)
    async with stand_in.router() as router:
        answers = await post_many(router.url + PREDICT.format(model="adder"), 40)
    failed = [body for status, body in answers if status == 502]
    assert len(failed) == resetting.received > 0
    assert b"not sent again" in failed[0]
    assert accepting.received + resetting.received == 40


async def test_server_sent_events_stream_through_as_they_are_made(stand_in: Any, fakes: Any) -> None:
    streaming = fakes("stream")
    await stand_in.deploy("gpt", streaming.address)
    async with stand_in.router() as router, aiohttp.ClientSession() as client:
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


async def test_large_bodies_pass_through_both_ways_whatever_their_framing(stand_in: Any, fakes: Any) -> None:
    echo = fakes("echo")
    await stand_in.deploy("adder", echo.address)
    body = bytes(range(256)) * (12 * 1024)  # 3 MiB: beyond what the router keeps for a retry

    async def pieces() -> Any:
        for start in range(0, len(body), 100_000):
            yield body[start : start + 100_000]

    async with stand_in.router() as router, aiohttp.ClientSession() as client:
        url = router.url + PREDICT.format(model="adder")
        async with client.post(url, data=io.BytesIO(body)) as response:  # Content-Length
            assert response.status == 200
            assert await response.read() == body
        async with client.post(url, data=pieces()) as response:  # chunked
            assert response.status == 200
            assert await response.read() == body
    assert [len(received) for received in echo.bodies] == [len(body)] * 2


async def test_the_emulator_filters_lists_and_watches_by_label_as_the_api_server_does(stand_in: Any) -> None:
    assert stand_in.selects("a=1,b in (x, y),!c", {"a": "1", "b": "y"})
    assert not stand_in.selects("a=1,b in (x, y),!c", {"a": "1", "b": "y", "c": ""})
    assert stand_in.selects("a!=1,b notin (x)", {"b": "z"})
    assert not stand_in.selects("kubernetes.io/service-name", {"a": "1"})
    path = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
    selector = "kubernetes.io/service-name=adder"
    await stand_in.put_slice(stand_in.slice("adder", ["127.0.0.1:1"]))
    await stand_in.put_slice(stand_in.slice("other", ["127.0.0.1:2"]))
    listed = await (await stand_in.server.get(path, params={"labelSelector": selector})).json()
    assert [item["metadata"]["name"] for item in listed["items"]] == ["adder-slice"]
    assert listed["metadata"]["resourceVersion"] == str(stand_in.server.revision)
    params = {"labelSelector": selector, "watch": "true"}
    async with stand_in.server.get(path, params=params) as watch:
        first = json.loads(await watch.content.readline())
        assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "adder-slice")
        relabelled = stand_in.slice("adder", ["127.0.0.1:1"])
        relabelled["metadata"]["labels"]["kubernetes.io/service-name"] = "moved"
        await stand_in.put_slice(stand_in.slice("other", ["127.0.0.1:3"]))  # not selected: no event
        await stand_in.put_slice(relabelled)  # no longer selected: DELETED
        second = json.loads(await watch.content.readline())
        assert (second["type"], second["object"]["metadata"]["name"]) == ("DELETED", "adder-slice")


async def test_load_the_router_did_not_send_steers_requests_away(stand_in: Any, fakes: Any) -> None:
    busy, idle, draining = fakes("ok"), fakes("ok"), fakes("ok")
    busy.load["queued_items"] = 1000  # another router's, or direct clients'
    draining.load["ready"] = False  # shutting down, still in the EndpointSlice
    await stand_in.deploy("adder", busy.address, idle.address, draining.address)
    async with stand_in.router(load_poll_interval_s=0.1) as router:

        async def busy_seen() -> bool:
            return f'replica="{busy.address}"}} 1000.0' in await _metrics(router.url)

        await stand_in.eventually(busy_seen, what="the router to read the busy replica's load")
        answers = await post_many(router.url + PREDICT.format(model="adder"), 40)
    assert [status for status, _ in answers] == [200] * 40
    assert (busy.received, idle.received, draining.received) == (0, 40, 0)


async def test_a_client_that_leaves_is_seen_leaving_by_the_replica(stand_in: Any, fakes: Any) -> None:
    hanging = fakes("hang")
    await stand_in.deploy("adder", hanging.address)
    async with stand_in.router() as router:
        client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5))
        async with client:
            try:
                await client.post(router.url + PREDICT.format(model="adder"), json={"instances": [1]})
            except TimeoutError:
                pass  # the client gives up and closes its connection
            else:
                raise AssertionError("the hanging replica answered")
        await stand_in.eventually(lambda: hanging.left == 1, what="the replica to see its client leave")
    assert hanging.received == 1


async def test_a_replica_that_closes_after_answering_gets_a_new_connection(stand_in: Any, fakes: Any) -> None:
    closing = fakes("closing")
    await stand_in.deploy("adder", closing.address)
    async with stand_in.router() as router:
        answers = await post_many(router.url + PREDICT.format(model="adder"), 30, connections=1)
        metrics = await _metrics(router.url)
    assert [status for status, _ in answers] == [200] * 30
    assert closing.received == 30
    assert "batchd_router_retries_total{" not in metrics  # each went on a fresh connection, first time


async def test_a_replica_that_does_not_answer_is_a_504_past_its_request_timeout(
    stand_in: Any, fakes: Any
) -> None:
    hanging = fakes("hang")
    document = manifest("adder", batching={"request_timeout_s": 0.5})
    await stand_in._call("POST", f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}", document)
    await stand_in.put_slice(stand_in.slice("adder", [hanging.address]))
    async with stand_in.router(answer_margin_s=0.2) as router, aiohttp.ClientSession() as client:
        url = router.url + PREDICT.format(model="adder")
        started = time.monotonic()
        async with client.post(url, json={"instances": [1]}) as response:
            waited = time.monotonic() - started
            error = (await response.json())["error"]
            assert response.status == 504, error
        assert 0.7 <= waited < 5  # request_timeout_s + answer_margin_s, not the client's patience
        assert f"replica {hanging.address} of default/adder did not answer within 0.7 s" in error
        # The client's own time left is the bound when it is shorter.
        started = time.monotonic()
        async with client.post(url, json={"instances": [1]}, headers={"batchd-timeout-s": "0.2"}) as response:
            assert response.status == 504
        assert time.monotonic() - started < 0.6
        await stand_in.eventually(lambda: hanging.left == 2, what="the replica to see the router leave")
    assert hanging.received == 2  # each sent once, never again
