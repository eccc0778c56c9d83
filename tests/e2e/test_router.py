"""The router end to end on the stand-in cluster (real replica processes as pods, the emulated API
server), for the two faults not yet moved onto the real cluster (`test_router_cluster.py`): a
replica killed mid-load loses only what it had accepted; a router restarted mid-load loses nothing
it had been sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from batchd.api.pod import ROUTER_COMPONENT
from batchd.testing.apiserver import ApiServer
from batchd.testing.closed_loop import CONNECTIONS, KeepAliveClient, metric
from batchd.testing.cluster import Cluster, PodView
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import api_server, create, eventually, running_operator
from batchd.testing.servers import ServerProcess, start_router

pytestmark = pytest.mark.slow

NS = "default"
START_S = 60.0  # a replica process starts in about a second; the machine may be busy
# One batch of 8 items every 50 ms: 160 items/s a replica, the keep-alive scenario's slow adder.
SLOW = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.05}}
BATCHING = {"max_batch_size": 8, "batch_wait_timeout_s": 0.005, "max_queued_requests": 1024}
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
