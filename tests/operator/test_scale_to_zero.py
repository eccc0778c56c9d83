"""Scale to zero, the operator's side: the real operator against the emulated API server, with a
replica and a router that answer `GET /load` and `GET /held` as each test sets them, over real HTTP
on loopback (a router that cannot answer, requests held when the delay ends, no router at all).
The whole path on a real cluster, a request through the chart's router waking a deployment at
zero: `tests/e2e/test_autoscaling.py`.

The router and the replica are stand-ins (one small aiohttp server, what each answers set by the
test), reached through pods in the emulator as the operator finds them in a cluster: the replica
pod by the labels the operator gave its template, the router pod by the chart's label selector.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web

from batchd.api.pod import ROUTER_COMPONENT
from batchd.operator import children
from batchd.testing.apiserver import ApiServer
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import api_server, create, eventually, patch, running_operator

NS = "default"
ROUTER_NS = "batchd-system"
ROUTER_SELECTOR = {**ROUTER_COMPONENT, "app.kubernetes.io/instance": "batchd"}
ROUTER_URL = "http://batchd-router.batchd-system.svc"
POLL_S = 0.1
DELAY_S = 1.0  # scale_to_zero_delay_s


@dataclass
class Standin:
    """What the fake router holds and the fake replica reports; each request it answers is counted."""

    held: list[dict[str, Any]] = field(default_factory=list)
    held_status: int = 200
    held_reads: list[float] = field(default_factory=list)  # when each GET /held came
    port: int = 0

    async def polled_for(self, seconds: float) -> None:
        """Wait (bounded) until the operator's reads of /held from now on span `seconds`."""
        since = len(self.held_reads)
        await eventually(
            lambda: (
                len(self.held_reads) > since + 1 and self.held_reads[-1] - self.held_reads[since] > seconds
            ),
            what=f"reads of /held over {seconds} s",
        )

    async def serve_held(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        self.held_reads.append(time.monotonic())
        if self.held_status != 200:
            return aiohttp.web.json_response({"error": "not now"}, status=self.held_status)
        return aiohttp.web.json_response({"deployments": self.held})

    async def serve_load(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        load = {"ready": True, "queued_items": 0, "running_items": 0, "batching_revision": 1}
        return aiohttp.web.json_response(load)


@contextlib.asynccontextmanager
async def standin() -> AsyncIterator[Standin]:
    state = Standin()
    app = aiohttp.web.Application()
    app.router.add_get("/held", state.serve_held)
    app.router.add_get("/load", state.serve_load)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.port = runner.addresses[0][1]
    try:
        yield state
    finally:
        await runner.cleanup()


async def ready_pod(server: ApiServer, namespace: str, name: str, labels: dict[str, str], port: int) -> None:
    """A pod as the kubelet reports it once it is Ready, listening on loopback `port`."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "containers": [{"name": "main", "image": "x", "ports": [{"name": "http", "containerPort": port}]}]
        },
    }
    response = await server.post(f"/api/v1/namespaces/{namespace}/pods", json=pod)
    assert response.status == 201, await response.text()
    ready = {"type": "Ready", "status": "True"}
    status = {"phase": "Running", "podIP": "127.0.0.1", "conditions": [ready]}
    await patch(server, f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status})


def replicas(server: ApiServer, name: str) -> int | None:
    deployment = server.get_object("apps/deployments", NS, name) or {}
    value = deployment.get("spec", {}).get("replicas")
    return value if isinstance(value, int) else None


def events(server: ApiServer, reason: str) -> list[str]:
    return [str(event.get("message")) for event in server.posted_events if event.get("reason") == reason]


def ready_condition(server: ApiServer, name: str) -> dict[str, Any]:
    resource = server.get_object("serving.batchd.dev/batcheddeployments", NS, name) or {}
    for condition in resource.get("status", {}).get("conditions", []):
        if condition["type"] == "Ready":
            return dict(condition)
    return {}


async def scaled_to_zero(server: ApiServer, name: str) -> dict[str, Any]:
    """The Ready condition, once it says the deployment is at zero (bounded wait)."""
    return await eventually(
        lambda: (
            ready_condition(server, name).get("reason") == "ScaledToZero" and ready_condition(server, name)
        ),
        what=f"{name}: Ready=False ScaledToZero",
    )


def to_zero(name: str, num_replicas: int = 1, **autoscaling: Any) -> dict[str, Any]:
    spec = {"min_replicas": 0, "max_replicas": 3, "target_ongoing_items": 4, "scale_to_zero_delay_s": DELAY_S}
    return manifest(name, {"handler": "m:C"}, num_replicas=num_replicas, autoscaling={**spec, **autoscaling})


@contextlib.asynccontextmanager
async def stack(tmp_path: Path, *, poll_s: float = POLL_S) -> AsyncIterator[tuple[ApiServer, Standin]]:
    async with api_server(tmp_path) as server, standin() as fake:
        settings = {
            "replica_poll_interval_s": poll_s,
            "wake_poll_interval_s": POLL_S,
            "autoscaling_status_interval_s": POLL_S,
            "router_url": ROUTER_URL,
            "router_namespace": ROUTER_NS,
            "router_selector": ",".join(f"{k}={v}" for k, v in ROUTER_SELECTOR.items()),
        }
        async with running_operator(server, **settings):
            await ready_pod(server, ROUTER_NS, "batchd-router-1", ROUTER_SELECTOR, fake.port)
            yield server, fake


async def test_requests_held_for_a_deployment_keep_it_from_going_to_zero(tmp_path: Path) -> None:
    async with stack(tmp_path) as (server, fake):
        fake.held = [
            {"namespace": NS, "name": "busy", "model": "busy", "held_requests": 1, "oldest_held_s": 0.1}
        ]
        await create(server, to_zero("busy"))
        await ready_pod(server, NS, "busy-1", children.labels("busy"), fake.port)
        # Polls spanning twice the delay, all seeing a held request: still one replica.
        await fake.polled_for(2 * DELAY_S)
        assert replicas(server, "busy") == 1 and not events(server, "ScaledToZero")
        fake.held = []
        await eventually(lambda: replicas(server, "busy") == 0, what="scaled to zero once nothing is held")


async def test_a_router_that_cannot_say_what_it_holds_keeps_the_last_replica(tmp_path: Path) -> None:
    async with stack(tmp_path) as (server, fake):
        fake.held_status = 500
        await create(server, to_zero("unsure"))
        await ready_pod(server, NS, "unsure-1", children.labels("unsure"), fake.port)
        await fake.polled_for(2 * DELAY_S)
        assert replicas(server, "unsure") == 1
        fake.held_status = 200
        await eventually(
            lambda: replicas(server, "unsure") == 0, what="scaled to zero once the router answers"
        )


async def test_without_a_router_nothing_wakes_so_the_status_says_to_raise_min_replicas(
    tmp_path: Path,
) -> None:
    async with api_server(tmp_path) as server, running_operator(server, replica_poll_interval_s=POLL_S):
        await create(
            server,
            manifest(
                "cold", {"handler": "m:C"}, num_replicas=0, autoscaling={"min_replicas": 0, "max_replicas": 2}
            ),
        )
        condition = await scaled_to_zero(server, "cold")
        assert "no router runs to hold requests" in condition["message"]
        resource = server.get_object("serving.batchd.dev/batcheddeployments", NS, "cold") or {}
        assert resource["status"]["url"].startswith("http://cold.default.svc")


async def test_a_deployment_at_zero_wakes_between_full_polls(tmp_path: Path) -> None:
    # Full polls a minute apart: only the routers' wake reads can start the replica in time.
    async with stack(tmp_path, poll_s=60.0) as (server, fake):
        await create(server, to_zero("cold", num_replicas=0))
        await scaled_to_zero(server, "cold")
        fake.held = [
            {"namespace": NS, "name": "cold", "model": "cold", "held_requests": 1, "oldest_held_s": 0.2}
        ]
        await eventually(lambda: replicas(server, "cold") == 1, what="woken before the next full poll")
        (woke,) = await eventually(lambda: events(server, "ScaledFromZero"), what="the ScaledFromZero event")
        assert woke.startswith("0 -> 1 replicas: 1 request(s) held by the routers")
