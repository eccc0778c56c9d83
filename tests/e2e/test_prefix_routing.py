"""Prefix caching and prefix-aware routing end to end on a real cluster: the chart's operator and
router in pods from our images, two replica pods of a tiny GPT-2 (built here, shipped in a
ConfigMap), chats sent through the router's Service as a client in the cluster would.

What a client notices: while the replicas are balanced, every later turn of a conversation is
answered from the cache of the replica that served the earlier ones (`cached_tokens` in its
usage, and that replica's own request count), and new conversations spread over both; one hot
prefix sent by many clients at once spreads over both replicas instead of piling onto the one that
holds it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from batchd.api.pod import REPLICA_METRICS_PORT
from batchd.testing.closed_loop import metric
from batchd.testing.kubernetes import handlers
from batchd.testing.kubernetes.components import forbidden
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import ONE_ROUTER, Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.models import GPT2_CHAT_TEMPLATE, build_gpt2
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow

START_S = 240.0  # two pods load and check a model on a busy 2-core node
NAME = "chat"
# Small enough for a ConfigMap (under 1 MiB with its tokenizer), long enough for a conversation.
GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 512}
MODEL = {
    "name": NAME,
    "task": "text-generation",
    "source": handlers.model_source(),
    "device": "cpu",
    "generation": {"max_new_tokens": 8, "chat_template": GPT2_CHAT_TEMPLATE, "prefix_cache_bytes": 64 << 20},
}
# The load guard: a replica 2 items above the least loaded (a quarter of 8) is too busy for its prefixes.
BATCHING = {"max_batch_size": 8, "max_queued_requests": 256, "request_timeout_s": 120}
SYSTEM = "You are a careful assistant who answers every question about the weather in full sentences. " * 3
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Stack:
    release: Release

    @property
    def router(self) -> str:
        return self.release.router_url()

    @functools.cached_property
    def admin(self) -> str:
        """The router's admin port (`/metrics`): its pod's, no Service's."""
        return self.release.router_admin_url()

    def ready_pods(self, count: int) -> list[str]:
        """Where the ready pods serve their metrics (waits until `count` are ready)."""

        def probe() -> list[str]:
            pods, ready = self.release.pods(NAME), self.release.pods(NAME, ready=True)
            return (
                [f"http://{p['status']['podIP']}:{REPLICA_METRICS_PORT}" for p in ready]
                if len(pods) == len(ready) == count
                else []
            )

        return eventually(probe, timeout_s=START_S, what=f"{count} ready pods of {NAME}")


@pytest.fixture(scope="module")
def stack(
    control_plane: ControlPlane, kube_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("prefix")
    with installed(control_plane, logs, ONE_ROUTER, wait=True) as release:
        release.apply(handlers.config_map())
        release.apply(handlers.model_config_map(build_gpt2(logs / "gpt2", **GPT2)), server_side=True)
        release.apply(
            manifest(NAME, MODEL, num_replicas=2, batching=BATCHING, **handlers.pod_spec_with_model())
        )
        yield Stack(release)
        assert forbidden(control_plane, release.router_user) == []


def conversation(topic: int, answers: list[str]) -> list[dict[str, str]]:
    """Conversation `topic` up to its next question: every earlier question and its answer."""
    messages = [{"role": "system", "content": f"Conversation {topic}. {SYSTEM}"}]
    for turn, answer in enumerate(answers):
        messages += [
            {"role": "user", "content": f"What about the weather on day {turn} of topic {topic}?"},
            {"role": "assistant", "content": answer},
        ]
    return [*messages, {"role": "user", "content": f"And on day {len(answers)} of topic {topic}?"}]


async def chat(client: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": NAME, "messages": messages, "max_tokens": 8, "temperature": 0}
    async with client.post(url + CHAT, json=body) as answer:
        assert answer.status == 200, await answer.text()
        found: dict[str, Any] = await answer.json()
        return found


async def served(client: aiohttp.ClientSession, pods: list[str]) -> list[float]:
    """Requests each pod has answered (its own count, whatever the outcome)."""
    return [await metric(client, pod, "batchd_requests_total") for pod in pods]


async def counted(client: aiohttp.ClientSession, pods: list[str], total: float) -> list[float]:
    """`served` once the pods' counts add up to `total` (a count may follow its answer by a moment)."""
    deadline = asyncio.get_running_loop().time() + 10
    while sum(found := await served(client, pods)) < total:
        assert asyncio.get_running_loop().time() < deadline, f"the pods counted {found}, not {total}"
        await asyncio.sleep(0.05)
    return found


async def test_later_turns_follow_the_first_while_balanced_and_a_hot_prefix_spreads(stack: Stack) -> None:
    pods = await asyncio.to_thread(stack.ready_pods, 2)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
        deadline = asyncio.get_running_loop().time() + 60
        while await metric(client, stack.admin, "batchd_router_ready_replicas") != 2:
            assert asyncio.get_running_loop().time() < deadline, "the router did not see two ready replicas"
            await asyncio.sleep(0.1)
        # Conversations one turn at a time: the fleet stays balanced (one request at a time).
        topics, homes = range(12), dict[int, int]()  # all on one replica by chance: 1 in 2,048
        answers: dict[int, list[str]] = {topic: [] for topic in topics}
        for turn in range(3):
            for topic in topics:
                before = await served(client, pods)
                answer = await chat(client, stack.router, conversation(topic, answers[topic]))
                after = await counted(client, pods, sum(before) + 1)
                (home,) = [n for n in range(2) if after[n] > before[n]]
                assert homes.setdefault(topic, home) == home, (
                    f"turn {turn} of {topic} went to the other replica"
                )
                cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
                assert (cached > 0) == (turn > 0), f"turn {turn} of {topic}: {cached} cached tokens"
                answers[topic].append(answer["choices"][0]["message"]["content"])
        assert set(homes.values()) == {0, 1}, "new conversations spread by load"

        # One hot prefix, many clients at once: the replica that holds it fills, the rest spread.
        before = await served(client, pods)
        hot = [{"role": "system", "content": f"Hot. {SYSTEM}"}]
        for wave in range(3):
            await asyncio.gather(
                *(chat(client, stack.router, [*hot, {"role": "user", "content": f"Question {wave}-{n}?"}])
                  for n in range(24))
            )  # fmt: skip
        after = await counted(client, pods, sum(before) + 72)
        shares = [(a - b) / 72 for a, b in zip(after, before, strict=True)]
        assert min(shares) >= 0.2, f"the hot prefix piled onto one replica: {shares}"
        routed = {
            outcome: await metric(client, stack.admin, "batchd_router_prefix_routes_total", outcome=outcome)
            for outcome in ("hit", "miss", "imbalanced")
        }
        assert routed["hit"] >= 16 and routed["imbalanced"] > 0, routed
