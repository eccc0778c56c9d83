"""Prefix-aware routing through the router as a real process, its endpoints written to a real API
server, fake replicas that say what they were sent and report the load a test gives them.

What a client notices: while the replicas are balanced, every turn of a conversation goes to the
replica that served its first; a replica that reports itself much busier than the others gets no
more of the prefixes it holds, which then spread; callers a deployment keeps apart are routed
apart; the router's metrics say how each request was routed.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp

from batchd.api.headers import FAIRNESS_HEADER

CHAT = "/v1/chat/completions"
GENERATE = "/v2/models/chat/generate"
SYSTEM = "You are a careful assistant who answers every question in full sentences. " * 6
MODEL = {"task": "text-generation", "source": "file:///models/tiny-gpt2"}  # never loaded: replicas are fakes
BATCHING = {"max_batch_size": 8}  # the load guard: 2 items above the least loaded (a quarter of 8)


def conversation(topic: str, turns: int) -> list[dict[str, str]]:
    """A conversation of its own from its first words (conversations that share a system prompt
    follow the first of them while the replicas are balanced)."""
    system = f"On {topic}: {SYSTEM}"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Tell me about {topic}."}]
    for turn in range(1, turns):
        messages += [
            {"role": "assistant", "content": f"Here is part {turn} about {topic}, at some length."},
            {"role": "user", "content": f"And then, after part {turn}?"},
        ]
    return messages


def served_by(fakes: list[Any], marker: str) -> list[int]:
    """How many bodies holding `marker` each of `fakes` was sent."""
    return [sum(marker.encode() in body for body in fake.bodies) for fake in fakes]


async def chat(client: aiohttp.ClientSession, url: str, messages: Any, caller: str | None = None) -> None:
    headers = {FAIRNESS_HEADER.decode(): caller} if caller else None
    async with client.post(
        url + CHAT, json={"model": "chat", "messages": messages}, headers=headers
    ) as answer:
        assert answer.status == 200, await answer.text()


async def routes(client: aiohttp.ClientSession, url: str, outcome: str) -> float:
    async with client.get(f"{url}/metrics") as response:
        text = await response.text()
    found = re.search(
        rf'^batchd_router_prefix_routes_total{{[^}}]*outcome="{outcome}"[^}}]*}} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


async def test_turns_of_a_conversation_follow_the_first_until_its_replica_is_too_busy(
    cluster: Any, fakes: Any
) -> None:
    replicas = [fakes("ok"), fakes("ok")]
    await cluster.deploy("chat", *(fake.address for fake in replicas), serves=MODEL, batching=BATCHING)
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        topics = [f"topic {n}" for n in range(12)]  # all on one replica by chance: 1 in 2,048
        for turns in range(1, 5):  # every conversation, one turn more each round
            for topic in topics:
                await chat(client, router.url, conversation(topic, turns))
        homes = {}
        for topic in topics:
            sent = served_by(replicas, f"about {topic}.")
            assert sorted(sent) == [0, 4], f"{topic}'s turns went to {sent}"
            homes[topic] = sent.index(4)
        assert set(homes.values()) == {0, 1}, "new conversations spread by load"
        assert await routes(client, cluster.admin_url, "hit") == 12 * 3  # every turn after the first

        # One replica says it holds far more than the other: its conversations go by load now.
        busy = homes[topics[0]]
        replicas[busy].load = {"ready": True, "queued_items": 20, "running_items": 8}
        await cluster.eventually(
            lambda: _load_seen(client, cluster.admin_url, replicas[busy].address, 28),
            what="the busy replica's load",
        )
        await chat(client, router.url, conversation(topics[0], 5))
        await chat(client, router.url, conversation(topics[0], 6))
        assert served_by(replicas, f"about {topics[0]}.")[1 - busy] == 2
        # then the other replica held it too
        assert await routes(client, cluster.admin_url, "imbalanced") == 1


async def _load_seen(client: aiohttp.ClientSession, url: str, replica: str, items: float) -> bool:
    async with client.get(f"{url}/metrics") as response:
        text = await response.text()
    found = re.search(
        rf'^batchd_router_replica_load_items{{[^}}]*replica="{re.escape(replica)}"[^}}]*}} (\S+)$', text, re.M
    )
    return found is not None and float(found.group(1)) >= items


async def test_the_index_keys_by_tenant_never_by_a_header_the_client_wrote(cluster: Any, fakes: Any) -> None:
    replicas = [fakes("ok"), fakes("ok")]
    await cluster.deploy("chat", *(fake.address for fake in replicas), serves=MODEL, batching=BATCHING)
    shared_model = {**MODEL, "generation": {"prefix_cache_scope": "deployment"}}
    shared = [fakes("ok"), fakes("ok")]
    await cluster.deploy("shared", *(fake.address for fake in shared), serves=shared_model, model="shared")
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        messages = conversation("secrets", 1)
        await chat(client, router.url, messages, caller="alice")
        # An open deployment's callers are one tenant: a fairness id keeps no caller apart.
        await chat(client, router.url, messages, caller="bob")
        await chat(client, router.url, messages, caller="alice")
        admin = cluster.admin_url
        assert await routes(client, admin, "hit") == 2 and await routes(client, admin, "miss") == 1
        body = {"model": "shared", "messages": messages}
        for caller in ("alice", "bob", "carol"):
            headers = {FAIRNESS_HEADER.decode(): caller}
            async with client.post(router.url + CHAT, json=body, headers=headers) as answer:
                assert answer.status == 200
        assert sorted(served_by(shared, "about secrets.")) == [0, 3], (
            "one cache for every caller: one replica"
        )


async def test_the_prompt_of_a_generate_request_and_no_prefix_where_replicas_cache_none(
    cluster: Any, fakes: Any
) -> None:
    replicas = [fakes("ok"), fakes("ok")]
    await cluster.deploy("chat", *(fake.address for fake in replicas), serves=MODEL)
    plain = [fakes("ok"), fakes("ok")]
    uncached = {**MODEL, "generation": {"prefix_cache_bytes": 0}}
    await cluster.deploy("plain", *(fake.address for fake in plain), serves=uncached, model="plain")
    async with cluster.router() as router, aiohttp.ClientSession() as client:
        for n in range(6):
            body = {"text_input": f"{SYSTEM} question {n}", "parameters": {"max_tokens": 4}}
            async with client.post(router.url + GENERATE, json=body) as answer:
                assert answer.status == 200
            async with client.post(router.url + "/v2/models/plain/generate", json=body) as answer:
                assert answer.status == 200
        assert sorted(served_by(replicas, "question")) == [0, 6]
        assert await routes(client, cluster.admin_url, "hit") == 5
        assert sum(fake.received for fake in plain) == 6  # routed by load, and not counted as prefixes
