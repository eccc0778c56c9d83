"""The router end to end on a real cluster: the chart's operator and router running in pods from our
images, replicas as pods of the node, the router reached through its Service's ClusterIP as a
client in the cluster would, scaled and deleted with `kubectl`.

What a client notices: a keep-alive client is spread over every replica once it is ready; a replica
killed mid-load loses only what it had accepted; a router restarted mid-load loses nothing it had
been sent; requests held for a deployment at zero replicas wake it and go to its first replica, or
are told clearly that the deployment was deleted.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from batchd.api.pod import REPLICA_METRICS_PORT, REPLICA_PORT, selector_string
from batchd.testing.closed_loop import CONNECTIONS, UNSENT, KeepAliveClient, metric
from batchd.testing.kubernetes import handlers
from batchd.testing.kubernetes.components import forbidden
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import ONE_ROUTER, Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.traffic import Outcome, Traffic, unanswered
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow

START_S = 150.0  # a replica pod starts in seconds; the machine may be busy
# A request held at zero replicas waits for the whole wake-up (the operator's poll of the routers,
# the Deployment's pod scheduled and started, the model loaded, the readiness probe, the
# EndpointSlice): on a starved 2-core node that passes the chart's default 30 s.
HOLD_S = 120
# One batch of 8 items every 50 ms: 160 items/s a replica.
SLOW = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.05}}
BATCHING = {"max_batch_size": 8, "batch_wait_timeout_s": 0.005, "max_queued_requests": 1024}

# Priority classes: one batch of 4 items every 200 ms, 20 items/s a replica, a short queue (few
# requests a second, so that the node's CPU, shared with other tests, is not what refuses them).
RANKED = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.2}}
# Each replica asks for a quarter of a CPU, as a deployment does. A pod that asks for none is
# BestEffort: it gets what the node's other pods leave (2 CPU shares against the router's 102).
# Under the full suite, whose other worker leaves the node little CPU, the router serving this
# load took nearly all of it: the starved replicas served a few items a second, their queues
# filled with the high class and refused it (queue full), and the router's retry found the other
# replica as full (66 of 160 high-class requests got 503).
RANKED_RESOURCES = {"requests": {"cpu": "250m"}}
RANKED_BATCHING = {
    "max_batch_size": 4,
    "batch_wait_timeout_s": 0.005,
    "max_queued_requests": 8,
    "priority_classes": [{"name": "search", "priority": 10}, {"name": "indexing", "priority": 0}],
    "default_priority_class": "indexing",
}


@dataclass(frozen=True)
class Stack:
    release: Release

    @property
    def cluster(self) -> ControlPlane:
        return self.release.cluster

    @property
    def router(self) -> str:
        return self.release.router_url()

    @functools.cached_property
    def admin(self) -> str:
        """The router's admin port (`/metrics`, `GET /held`): its pod's, no Service's."""
        return self.release.router_admin_url()

    def url(self, model: str) -> str:
        return f"{self.router}/v1/models/{model}:predict"

    def apply(self, name: str, model: dict[str, Any], **spec: Any) -> None:
        document = manifest(name, model, **handlers.pod_spec(), **spec)
        self.release.apply(document)

    def ready_pods(self, name: str, count: int, port: int = REPLICA_PORT) -> list[str]:
        """The base URLs of the deployment's `count` ready pods on `port` (waits until there are
        that many)."""

        def probe() -> list[str]:
            pods = self.release.pods(name)
            ready = self.release.pods(name, ready=True)
            return (
                [f"http://{p['status']['podIP']}:{port}" for p in ready]
                if len(pods) == len(ready) == count
                else []
            )

        return eventually(probe, timeout_s=START_S, what=f"{count} ready pods of {name}")

    def restarted(self, pod: str) -> dict[str, Any]:
        """The pod's container's status once the kubelet has restarted it once and it is ready again."""
        document = json.loads(
            self.cluster.kubectl("get", "pod", "-n", self.release.namespace, pod, "-o", "json").stdout
        )
        status: dict[str, Any] = document["status"]["containerStatuses"][0]
        return status if status["restartCount"] == 1 and status["ready"] else {}


VALUES = {"router": {**ONE_ROUTER["router"], "hold": {"timeoutSeconds": HOLD_S}}}


@pytest.fixture(scope="module")
def stack(
    control_plane: ControlPlane, kube_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with installed(control_plane, tmp_path_factory.mktemp("router"), VALUES, wait=True) as release:
        release.apply(handlers.config_map())
        yield Stack(release)
        assert forbidden(control_plane, release.router_user) == []
        assert forbidden(control_plane, release.operator_user) == []


async def test_a_keep_alive_client_through_the_router_spreads_over_new_replicas(stack: Stack) -> None:
    stack.apply("slow", SLOW, batching=BATCHING)
    (first,) = stack.ready_pods("slow", 1, REPLICA_METRICS_PORT)
    load = KeepAliveClient(stack.url("slow"))
    running = asyncio.create_task(load.run())
    async with aiohttp.ClientSession() as client:
        try:
            await asyncio.to_thread(
                eventually, lambda: load.answered() >= 50, timeout_s=30, what="50 answers from one replica"
            )
            # The autoscaler's decision, as it writes it: three replicas.
            stack.cluster.kubectl("scale", "-n", stack.release.namespace, "bd/slow", "--replicas=3")
            pods = await asyncio.to_thread(stack.ready_pods, "slow", 3, REPLICA_METRICS_PORT)

            async def router_sees_three() -> bool:
                return await metric(client, stack.admin, "batchd_router_ready_replicas") == 3

            deadline = time.monotonic() + 20
            while not await router_sees_three():
                assert time.monotonic() < deadline, "the router did not see three ready replicas"
                await asyncio.sleep(0.1)
            before = [await metric(client, pod, "batchd_requests_total") for pod in pods]
            since = load.answered()
            await asyncio.to_thread(
                eventually, lambda: load.answered() >= since + 300, timeout_s=20, what="300 more answers"
            )
            after = [await metric(client, pod, "batchd_requests_total") for pod in pods]
        finally:
            load.stop()
            outcomes = await running
    shares = [
        (done - started) / max(1.0, sum(after) - sum(before))
        for done, started in zip(after, before, strict=True)
    ]
    assert all(share > 0.2 for share in shares), shares  # a third each is even
    assert first in pods
    assert set(outcomes) == {200}, {outcome: outcomes.count(outcome) for outcome in set(outcomes)}


async def predict(client: aiohttp.ClientSession, url: str, n: int) -> tuple[int, Any]:
    async with client.post(url, json={"instances": [n]}) as response:
        return response.status, await response.json()


async def held(client: aiohttp.ClientSession, stack: Stack, count: int) -> bool:
    async with client.get(f"{stack.admin}/held") as response:
        entries = (await response.json())["deployments"]
    return bool(sum(entry["held_requests"] for entry in entries) == count)


async def wait_held(client: aiohttp.ClientSession, stack: Stack, count: int) -> None:
    deadline = time.monotonic() + 20
    while not await held(client, stack, count):
        assert time.monotonic() < deadline, f"the router did not hold {count} requests"
        await asyncio.sleep(0.1)


async def test_requests_held_for_a_deployment_that_is_deleted_are_told_so(stack: Stack) -> None:
    ns = stack.release.namespace
    stack.apply("parked", SLOW, num_replicas=0)
    async with aiohttp.ClientSession() as client:
        waiting = [asyncio.create_task(predict(client, stack.url("parked"), n)) for n in range(3)]
        await wait_held(client, stack, 3)
        stack.cluster.kubectl("delete", "-n", ns, "bd/parked", "--wait=false")
        answers = await asyncio.gather(*waiting)
    assert answers == [(404, {"error": f"model 'parked': its BatchedDeployment {ns}/parked was deleted"})] * 3


async def test_requests_held_at_zero_replicas_wake_the_deployment_and_go_to_its_first_replica(
    stack: Stack,
) -> None:
    autoscaling = {
        "min_replicas": 0,
        "max_replicas": 2,
        "target_ongoing_items": 4,
        "scale_to_zero_delay_s": 60,
    }
    stack.apply("cold", SLOW, num_replicas=0, autoscaling=autoscaling)
    async with aiohttp.ClientSession() as client:
        sent = time.monotonic()
        waiting = [asyncio.create_task(predict(client, stack.url("cold"), n)) for n in range(6)]
        await wait_held(client, stack, 6)
        answers = await asyncio.wait_for(asyncio.gather(*waiting), START_S)
        waited_s = time.monotonic() - sent
        (woke,) = await asyncio.to_thread(
            eventually, lambda: stack.release.events("ScaledFromZero"), what="the ScaledFromZero event"
        )
        status = stack.release.get("bd", "cold")
        # Those that answered are Ready (the router sends only there); a second may be starting.
        ready = await asyncio.to_thread(stack.release.pods, "cold", ready=True)
        urls = [f"http://{pod['status']['podIP']}:{REPLICA_METRICS_PORT}" for pod in ready]
        answered = sum([await metric(client, url, "batchd_requests_total") for url in urls])
    assert [code for code, _ in answers] == [200] * 6
    assert sorted(body["predictions"][0] for _, body in answers) == [n + 1 for n in range(6)]
    assert answered == 6  # each held request went to a replica once
    # Why it woke, in the event and the status: what the routers held (all six, or the first few).
    assert re.fullmatch(r"0 -> [12] replicas: [1-6] request\(s\) held by the routers, .*", woke), woke
    assert (
        status is not None and "held by the routers" in status["status"]["autoscaling"]["last_scale_reason"]
    )
    assert waited_s < START_S


async def test_a_router_restarted_mid_load_answers_everything_it_was_sent(
    stack: Stack, kube_node: Node
) -> None:
    ns = stack.release.namespace
    stack.apply("steady", SLOW, batching=BATCHING, num_replicas=2)
    pods = stack.ready_pods("steady", 2, REPLICA_METRICS_PORT)  # where they count answers
    selector = f"app.kubernetes.io/component=router,app.kubernetes.io/instance={stack.release.name}"
    (router_pod,) = json.loads(
        stack.cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout
    )["items"]
    container = router_pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    load = KeepAliveClient(stack.url("steady"), retry_unsent=True)
    running = asyncio.create_task(load.run())
    try:
        await asyncio.to_thread(eventually, lambda: load.answered() >= 100, timeout_s=30, what="100 answers")
        # SIGTERM, as the kubelet sends it: the router turns unready, answers what it was sent (with
        # Connection: close) and exits 0 once drained; the kubelet starts it again.
        kube_node.ctr("tasks", "kill", "--signal", "SIGTERM", container)

        status = await asyncio.to_thread(
            eventually,
            lambda: stack.restarted(router_pod["metadata"]["name"]),
            timeout_s=90,
            what="the router back and ready",
        )
        since = load.answered()
        await asyncio.to_thread(
            eventually, lambda: load.answered() >= since + 100, timeout_s=30, what="100 answers after"
        )
    finally:
        load.stop()
        outcomes = await running
    async with aiohttp.ClientSession() as client:
        replicas_answered = sum([await metric(client, pod, "batchd_requests_total") for pod in pods])
    assert status["lastState"]["terminated"]["exitCode"] == 0
    answers = [outcome for outcome in outcomes if isinstance(outcome, int)]
    # Every request a replica answered reached its client: nothing the router had been sent was
    # dropped. What the router never took (refused, or reset in its accept queue as it stopped
    # listening) and what met a connection it closed while idle, the client sent again; a router
    # not yet ready answers 503 with Retry-After.
    assert replicas_answered == answers.count(200)
    assert all(code == 503 and retry_after for code, retry_after, _ in load.refusals), load.refusals[:3]
    assert set(outcomes) - {200, 503} <= {UNSENT, "ServerDisconnectedError"}, Counter(load.errors)


async def test_a_replica_killed_mid_load_loses_only_what_it_had_accepted(
    stack: Stack, kube_node: Node
) -> None:
    ns = stack.release.namespace
    stack.apply("doomed", SLOW, batching=BATCHING, num_replicas=2)
    stack.ready_pods("doomed", 2)
    listed = json.loads(
        stack.cluster.kubectl("get", "pods", "-n", ns, "-l", selector_string("doomed"), "-o", "json").stdout
    )["items"]
    victim = listed[0]
    container = victim["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    load = KeepAliveClient(stack.url("doomed"))
    running = asyncio.create_task(load.run())
    try:
        await asyncio.to_thread(eventually, lambda: load.answered() >= 60, timeout_s=30, what="60 answers")
        kube_node.ctr("tasks", "kill", "--signal", "SIGKILL", container)  # no drain: its connections reset

        await asyncio.to_thread(
            eventually,
            lambda: stack.restarted(victim["metadata"]["name"]),
            timeout_s=90,
            what="the kubelet to restart the replica",
        )
        since = load.answered()
        await asyncio.to_thread(
            eventually, lambda: load.answered() >= since + 200, timeout_s=30, what="200 more answers"
        )
    finally:
        load.stop()
        outcomes = await running
    # Lost: only what the dead replica held when it died, at most one request a client connection
    # (the router cannot know whether those were computed); everything else was answered.
    assert set(outcomes) <= {200, 502}, set(outcomes)
    assert outcomes.count(502) <= CONNECTIONS


async def test_past_capacity_the_high_class_is_all_answered_and_the_low_class_takes_every_503(
    stack: Stack,
) -> None:
    stack.apply("ranked", RANKED, batching=RANKED_BATCHING, num_replicas=2, resources=RANKED_RESOURCES)
    await asyncio.to_thread(stack.ready_pods, "ranked", 2)
    url = stack.url("ranked")
    async with aiohttp.ClientSession() as client:
        deadline = time.monotonic() + 30
        while (await predict(client, url, 1))[0] != 200:  # the router has the replicas
            assert time.monotonic() < deadline, "the router did not route to the ranked deployment"
            await asyncio.sleep(0.2)
    capacity = 2 * 20  # items a second, both replicas
    path = url.removeprefix(stack.router)
    body = b'{"instances": [1]}'
    # Twice the capacity; the high class a quarter of the capacity, which replicas starved by a busy
    # machine still serve whole.
    high = Traffic(lambda: [stack.router], path, body, 0.25 * capacity, headers={"batchd-priority": "search"})
    low = Traffic(lambda: [stack.router], path, body, 1.75 * capacity)
    await asyncio.gather(high.run(10.0), low.run(10.0))
    high_statuses = Counter(outcome.status for outcome in high.outcomes)
    low_statuses = Counter(outcome.status for outcome in low.outcomes)
    metrics = await asyncio.to_thread(stack.ready_pods, "ranked", 2, REPLICA_METRICS_PORT)
    async with aiohttp.ClientSession() as client:
        replicas = [await metrics_text(client, pod) for pod in metrics]
        router = await metrics_text(client, stack.admin)
    assert high_statuses == {200: len(high.outcomes)}, who_refused(high.outcomes, replicas, router)
    assert unanswered(low.outcomes) == [] and low_statuses[503] > 0 and low_statuses[200] > 0, low_statuses


async def metrics_text(client: aiohttp.ClientSession, url: str) -> str:
    async with client.get(f"{url}/metrics") as response:
        return await response.text()


def who_refused(outcomes: list[Outcome], replicas: list[str], router: str) -> str:
    """What refused the high class, short enough for pytest to show whole: each refusal's message
    (the router's own, or a replica's that it relayed), what the replicas refused by class and
    reason, and what the router retried after a refusal."""
    refused = [outcome for outcome in outcomes if outcome.status != 200]
    messages = Counter(f"{o.status} {re.sub(r'[0-9.]+', 'N', o.error)[:90]}" for o in refused)
    by_replicas: Counter[str] = Counter()
    for text in replicas:
        for labels, value in re.findall(r"^batchd_class_refusals_total\{([^}]*)\} (\S+)$", text, re.M):
            if float(value):
                found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
                by_replicas[f"{found['priority_class']} {found['reason']}"] += int(float(value))
    retried = {
        reason: int(float(value))
        for reason, value in re.findall(
            r'^batchd_router_retries_total\{[^}]*reason="(\w+)"[^}]*\} (\S+)$', router, re.M
        )
        if float(value)
    }
    return (
        f"{len(refused)} of {len(outcomes)} high-class requests refused, by answer: {dict(messages)}; "
        f"the replicas refused (class reason: items): {dict(by_replicas)}; the router retried: {retried}"
    )
