"""The router end to end: the real operator, the stand-in cluster running real replica processes as
pods, and `batchd-router` as a process of its own watching BatchedDeployments and EndpointSlices.

What a client notices: a keep-alive client is spread over every replica once it is ready; a
replica killed mid-load loses only what it had accepted; a router restarted mid-load loses
nothing it had been sent; requests held for a deployment at zero replicas are answered by its
first replica, or told clearly that the deployment was deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from batchd.api.pod import ROUTER_COMPONENT
from batchd.router.rbac import rbac_rules
from batchd.testing.apiserver import ApiServer
from batchd.testing.cluster import Cluster, PodView
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import CR_PATH, api_server, create, eventually, patch, running_operator
from batchd.testing.servers import ServerProcess, start_router

pytestmark = pytest.mark.slow

NS = "default"
START_S = 60.0  # a replica process starts in about a second; the machine may be busy
# One batch of 8 items every 50 ms: 160 items/s a replica, the keep-alive scenario's slow adder.
SLOW = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.05}}
BATCHING = {"max_batch_size": 8, "batch_wait_timeout_s": 0.005, "max_queued_requests": 1024}
CONNECTIONS = 16  # the client's keep-alive pool
# Reads every replica's /load often, so that a test's few seconds see several readings.
ROUTER_SETTINGS = {"load_poll_interval_s": 0.2}
ROUTER_NS = "batchd-system"
ROUTER_LABELS = {**ROUTER_COMPONENT, "app.kubernetes.io/instance": "batchd"}


@dataclass
class Stack:
    server: ApiServer
    cluster: Cluster
    router: ServerProcess
    logs: Path

    def url(self, model: str) -> str:
        return f"{self.router.url}/v1/models/{model}:predict"


@contextlib.asynccontextmanager
async def stack(
    tmp_path: Path, *, restart_backoff_s: float = 0.5, **operator_settings: Any
) -> AsyncIterator[Stack]:
    """API server, operator, stand-in cluster and one router process, stopped in reverse."""
    async with (
        api_server(tmp_path) as server,
        running_operator(server, replica_poll_interval_s=0.2, **operator_settings),
        Cluster(server, tmp_path / "cluster", restart_backoff_s=restart_backoff_s) as cluster,
    ):
        logs = tmp_path / "logs"
        router = start_router(server.kubeconfig_path, logs, settings=ROUTER_SETTINGS)
        env = Stack(server, cluster, router, logs)
        try:
            await asyncio.to_thread(router.wait_ready, 60)
            yield env
        except BaseException as error:
            error.add_note(f"router log:\n{env.router.log_tail()}")
            raise
        finally:
            await asyncio.to_thread(env.router.stop, 20)  # the one running now (a test may restart it)


async def ready_pods(cluster: Cluster, name: str, count: int) -> list[PodView]:
    def probe() -> list[PodView]:
        pods = [pod for pod in cluster.pods(name) if not pod.terminating]
        return pods if len(pods) == count and all(pod.ready for pod in pods) else []

    return await eventually(probe, timeout_s=START_S, what=f"{count} ready pods of {name}")


async def metric(client: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`, from a server's /metrics."""
    async with client.get(f"{url}/metrics") as response:
        text = await response.text()
    total = 0.0
    for found_labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if all(f'{key}="{wanted}"' in found_labels for key, wanted in labels.items()):
            total += float(value)
    return total


@dataclass
class KeepAliveClient:
    """`connections` workers on one keep-alive pool, each sending its next request when its last
    one is answered (closed loop: the load follows what the replicas can do, no queue overflows).
    Each outcome is an HTTP status, or the name of the error when no answer came."""

    url: str
    connections: int = CONNECTIONS
    outcomes: list[int | str] = field(default_factory=list)
    # (status, Retry-After, body) of every answer that is not a 200
    refusals: list[tuple[int, str | None, str]] = field(default_factory=list)
    retry_unsent: bool = False  # send again what could not reach a router (refused to connect)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> list[int | str]:
        connector = aiohttp.TCPConnector(limit=self.connections)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
            await asyncio.gather(*(self._worker(client) for _ in range(self.connections)))
        return self.outcomes

    async def _worker(self, client: aiohttp.ClientSession) -> None:
        while not self._stop.is_set():
            n = len(self.outcomes)
            try:
                async with client.post(self.url, json={"instances": [n]}) as response:
                    body = await response.read()
                    self.outcomes.append(response.status)
                    if response.status != 200:
                        retry_after = response.headers.get("Retry-After")
                        self.refusals.append((response.status, retry_after, body.decode(errors="replace")))
            except aiohttp.ClientConnectorError as error:
                self.outcomes.append(type(error).__name__)
                if not self.retry_unsent:
                    raise
                await asyncio.sleep(0.05)  # the client's back-off while nothing listens
            except (aiohttp.ClientError, TimeoutError) as error:
                self.outcomes.append(type(error).__name__)

    def stop(self) -> None:
        self._stop.set()

    def answered(self) -> int:
        return sum(isinstance(outcome, int) for outcome in self.outcomes)


async def test_a_keep_alive_client_through_the_router_spreads_over_new_replicas(tmp_path: Path) -> None:
    async with stack(tmp_path) as env, aiohttp.ClientSession() as client:
        await create(env.server, manifest("slow", SLOW, batching=BATCHING))
        (first,) = await ready_pods(env.cluster, "slow", 1)
        load = KeepAliveClient(env.url("slow"))
        running = asyncio.create_task(load.run())
        try:
            await eventually(lambda: load.answered() >= 50, timeout_s=30, what="50 answers from one replica")
            # The autoscaler's decision, as it writes it: three replicas.
            await patch(env.server, f"{CR_PATH.format(ns=NS)}/slow/scale", {"spec": {"replicas": 3}})
            pods = await ready_pods(env.cluster, "slow", 3)

            async def router_sees_three() -> bool:
                return await metric(client, env.router.url, "batchd_router_ready_replicas") == 3

            await eventually(router_sees_three, timeout_s=10, what="the router to see three ready replicas")
            before = [await metric(client, pod.url, "batchd_requests_total") for pod in pods]
            since = load.answered()
            # Within 10 s of the router seeing them ready, 300 requests: each replica takes its share.
            await eventually(lambda: load.answered() >= since + 300, timeout_s=10, what="300 more answers")
            after = [await metric(client, pod.url, "batchd_requests_total") for pod in pods]
        finally:
            load.stop()
            outcomes = await running
    shares = [
        (done - started) / max(1.0, sum(after) - sum(before))
        for done, started in zip(after, before, strict=True)
    ]
    assert all(share > 0.2 for share in shares), shares  # a third each is even
    assert first.name in {pod.name for pod in pods}
    assert set(outcomes) == {200}, {outcome: outcomes.count(outcome) for outcome in set(outcomes)}
    # Everything the router asked the API server is what its RBAC rules allow, and nothing more.
    allowed = {
        (rule["apiGroups"][0], rule["resources"][0], verb) for rule in rbac_rules() for verb in rule["verbs"]
    }
    assert env.server.router_calls == allowed


async def test_a_replica_killed_mid_load_loses_only_what_it_had_accepted(tmp_path: Path) -> None:
    # The kubelet restarts a killed container only after the test: the router must do without it.
    async with stack(tmp_path, restart_backoff_s=60) as env, aiohttp.ClientSession() as client:
        await create(env.server, manifest("slow", SLOW, batching=BATCHING, num_replicas=2))
        doomed, survivor = await ready_pods(env.cluster, "slow", 2)
        load = KeepAliveClient(env.url("slow"))
        running = asyncio.create_task(load.run())
        try:
            await eventually(lambda: load.answered() >= 60, timeout_s=30, what="60 answers")
            assert doomed.pid is not None
            os.killpg(doomed.pid, signal.SIGKILL)  # no drain: its connections reset
            killed_at = len(load.outcomes)

            async def router_sees_one() -> bool:
                return await metric(client, env.router.url, "batchd_router_ready_replicas") == 1

            await eventually(router_sees_one, what="the router to see the killed replica unready")
            unready_at = len(load.outcomes)
            retries_before = await metric(client, env.router.url, "batchd_router_retries_total")
            served_before = await metric(client, survivor.url, "batchd_requests_total")
            since = load.answered()
            await eventually(lambda: load.answered() >= since + 200, timeout_s=20, what="200 more answers")
            served_after = await metric(client, survivor.url, "batchd_requests_total")
            retries_after = await metric(client, env.router.url, "batchd_router_retries_total")
        finally:
            load.stop()
            outcomes = await running
    assert set(outcomes) <= {200, 502}, set(outcomes)
    # Lost: only what the dead replica held when it died, at most one request a client connection
    # (the router cannot know whether those were computed), and only around the kill. A request
    # that found it dead, on a new connection or on a pooled one it had closed, went to the survivor.
    assert outcomes.count(502) <= CONNECTIONS
    assert 502 not in outcomes[: killed_at - CONNECTIONS]
    assert 502 not in outcomes[unready_at + CONNECTIONS :]
    assert served_after - served_before >= 200
    # Once its EndpointSlice said unready, the router picked it no more: no request tried it again.
    assert retries_after == retries_before


async def test_a_router_restarted_mid_load_answers_everything_it_was_sent(tmp_path: Path) -> None:
    async with stack(tmp_path) as env, aiohttp.ClientSession() as client:
        await create(env.server, manifest("slow", SLOW, batching=BATCHING, num_replicas=2))
        pods = await ready_pods(env.cluster, "slow", 2)
        load = KeepAliveClient(env.url("slow"), retry_unsent=True)
        running = asyncio.create_task(load.run())
        try:
            await eventually(lambda: load.answered() >= 100, timeout_s=30, what="100 answers")
            # SIGTERM: the router turns unready, answers what it was sent (with Connection: close),
            # and exits 0 once drained; within 30 s, or this fails.
            exit_code = await asyncio.to_thread(env.router.terminate, 30)
            env.router = start_router(
                env.server.kubeconfig_path,
                env.logs,
                name="router-2",
                settings=ROUTER_SETTINGS,
                port=env.router.port,
            )
            await asyncio.to_thread(env.router.wait_ready, 60)
            since = load.answered()
            await eventually(lambda: load.answered() >= since + 100, timeout_s=20, what="100 answers after")
        finally:
            load.stop()
            outcomes = await running
        replicas_answered = sum([await metric(client, pod.url, "batchd_requests_total") for pod in pods])
    assert exit_code == 0
    answers = [outcome for outcome in outcomes if isinstance(outcome, int)]
    # The new router answers 503 + Retry-After until it has read the cluster (in a cluster its
    # Service sends it nothing before it is ready; here the client finds its port at once).
    assert all(status == 503 and retry_after for status, retry_after, _ in load.refusals), load.refusals[:3]
    # Every request a replica answered reached its client: nothing the old router had been sent
    # was dropped. What could not be sent (no router listening, a connection closed while idle)
    # the client sent again.
    assert replicas_answered == answers.count(200)
    assert set(outcomes) - {200, 503} <= {"ClientConnectorError", "ServerDisconnectedError"}, set(outcomes)


async def held(client: aiohttp.ClientSession, router: ServerProcess, count: int) -> bool:
    async with client.get(f"{router.url}/held") as response:
        entries = (await response.json())["deployments"]
    return sum(entry["held_requests"] for entry in entries) == count


async def predict(client: aiohttp.ClientSession, url: str, n: int) -> tuple[int, Any]:
    async with client.post(url, json={"instances": [n]}) as response:
        return response.status, await response.json()


async def test_requests_held_for_a_deployment_that_is_deleted_are_told_so(tmp_path: Path) -> None:
    async with stack(tmp_path) as env, aiohttp.ClientSession() as client:
        await create(env.server, manifest("parked", SLOW, num_replicas=0))
        url = env.url("parked")
        waiting = [asyncio.create_task(predict(client, url, n)) for n in range(3)]
        await eventually(lambda: held(client, env.router, 3), timeout_s=20, what="three requests held")
        response = await env.server.delete(f"{CR_PATH.format(ns=NS)}/parked")
        assert response.status == 200
        answers = await asyncio.gather(*waiting)
    assert (
        answers == [(404, {"error": "model 'parked': its BatchedDeployment default/parked was deleted"})] * 3
    )


async def router_pod(env: Stack) -> None:
    """The router process as the operator finds it in a cluster: a ready pod with the chart's labels
    in the router's namespace (no kubelet runs it: the process already does)."""
    pods = f"/api/v1/namespaces/{ROUTER_NS}/pods"
    container = {
        "name": "router",
        "image": "router",
        "ports": [{"name": "http", "containerPort": env.router.port}],
    }
    document = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "batchd-router-0", "namespace": ROUTER_NS, "labels": ROUTER_LABELS},
        "spec": {"containers": [container]},
    }
    response = await env.server.post(pods, json=document)
    assert response.status == 201, await response.text()
    status = {
        "phase": "Running",
        "podIP": env.router.host,
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    await patch(env.server, f"{pods}/batchd-router-0/status", {"status": status})


def events(server: ApiServer, reason: str) -> list[str]:
    return [str(event.get("message")) for event in server.posted_events if event.get("reason") == reason]


async def test_requests_held_at_zero_replicas_wake_the_deployment_and_go_to_its_first_replica(
    tmp_path: Path,
) -> None:
    router_settings = {
        "router_url": "http://batchd-router.batchd-system.svc",
        "router_namespace": ROUTER_NS,
        "router_selector": ",".join(f"{key}={value}" for key, value in ROUTER_LABELS.items()),
    }
    autoscaling = {
        "min_replicas": 0,
        "max_replicas": 2,
        "target_ongoing_items": 4,
        "scale_to_zero_delay_s": 60,
    }
    async with stack(tmp_path, **router_settings) as env, aiohttp.ClientSession() as client:
        await router_pod(env)
        await create(env.server, manifest("cold", SLOW, num_replicas=0, autoscaling=autoscaling))
        url = env.url("cold")
        sent = time.monotonic()
        waiting = [asyncio.create_task(predict(client, url, n)) for n in range(6)]
        await eventually(lambda: held(client, env.router, 6), timeout_s=20, what="six requests held")
        answers = await asyncio.wait_for(asyncio.gather(*waiting), START_S)
        waited_s = time.monotonic() - sent
        (woke,) = await eventually(
            lambda: events(env.server, "ScaledFromZero"), what="the ScaledFromZero event"
        )
        # Those that answered are ready (idle for less than the delay); a second may be starting.
        pods = [pod for pod in env.cluster.pods("cold") if pod.ready]
        answered = sum([await metric(client, pod.url, "batchd_requests_total") for pod in pods])
        status = (env.server.get_object("serving.batchd.dev/batcheddeployments", NS, "cold") or {})["status"]
    assert [status for status, _ in answers] == [200] * 6
    assert sorted(body["predictions"][0] for _, body in answers) == [n + 1 for n in range(6)]
    assert answered == 6  # each held request went to a replica once
    # Why it woke, in the event and the status: what the routers held (all six, or the first few).
    assert re.fullmatch(r"0 -> [12] replicas: [1-6] request\(s\) held by the routers, .*", woke), woke
    assert "held by the routers" in status["autoscaling"]["last_scale_reason"], status
    assert waited_s < START_S
