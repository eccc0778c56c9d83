"""The router as it runs in a cluster, on loopback: its own process (`python -m batchd.router`)
reading BatchedDeployments and EndpointSlices from the emulated API server, where a benchmark
publishes replicas as the EndpointSlice controller would once their pods are ready.

Every wait is a bounded poll on state; nothing sleeps to synchronise.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import yaml

from batchd.testing.apiserver import ApiServer, Resource, default_resources, kubeconfig_for
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import eventually
from batchd.testing.servers import ServerProcess, start_process

NAMESPACE = "default"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
DEPLOYMENTS = f"/apis/serving.batchd.dev/v1alpha1/namespaces/{NAMESPACE}/batcheddeployments"
# The labels the operator gives a replica Service, which the EndpointSlice controller copies onto
# its slices: the router's slice watch selects by them.
SERVICE_LABELS = {
    "app.kubernetes.io/name": "batchd-replica",
    "app.kubernetes.io/component": "replica",
    "app.kubernetes.io/managed-by": "batchd",
}


async def answers(url: str, status: int = 200) -> bool:
    """GET `url` answers `status` (no answer at all is false)."""
    try:
        async with aiohttp.ClientSession() as client, client.get(url) as response:
            return response.status == status
    except (aiohttp.ClientError, OSError):
        return False


def endpoint_slice(service: str, replica: ServerProcess) -> dict[str, Any]:
    """One ready replica in a slice of `service`, as the EndpointSlice controller writes it (a
    slice has one port, and each replica on loopback has its own)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-{replica.port}",
            "namespace": NAMESPACE,
            "labels": {**SERVICE_LABELS, "kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": replica.port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [replica.host], "conditions": {"ready": True}}],
    }


def _resources() -> list[Resource]:
    resources = default_resources()
    if not any(resource.plural == "endpointslices" for resource in resources):
        resources.append(Resource("discovery.k8s.io", "endpointslices", "EndpointSlice"))
    return resources


@dataclass
class Routed:
    """The emulated API server and the router process on it."""

    api: ApiServer
    router: ServerProcess
    deployment: str

    async def publish(self, replica: ServerProcess) -> None:
        """`replica` is ready: its slice appears, as the EndpointSlice controller would write it."""
        await self.api.post(SLICES, json=endpoint_slice(self.deployment, replica))

    async def held(self) -> int:
        """Requests the router holds for the deployment now (its `GET /held`)."""
        async with aiohttp.ClientSession() as client, client.get(f"{self.router.url}/held") as response:
            document = await response.json()
        return sum(int(entry["held_requests"]) for entry in document["deployments"])


@asynccontextmanager
async def routed(
    workdir: Path, deployment: str, replicas: Sequence[ServerProcess] = (), **settings: str
) -> AsyncIterator[Routed]:
    """The API server holding `deployment` (a BatchedDeployment; the model is its name) and the
    slices of `replicas`, and a router process on it (`settings`: BATCHD_* variables), yielded
    once the router is ready; the router is stopped on the way out."""
    async with ApiServer() as api, kmock.Server(api):
        api.register(_resources())
        kubeconfig = workdir / "kubeconfig.yaml"
        kubeconfig.write_text(yaml.safe_dump(kubeconfig_for(str(api.url).rstrip("/"))))
        await api.post(DEPLOYMENTS, json=manifest(deployment))
        env = {"KUBECONFIG": str(kubeconfig), "BATCHD_LOG_LEVEL": "warning", **settings}
        router = start_process("router", [sys.executable, "-m", "batchd.router"], workdir, env=env)
        stand_in = Routed(api, router, deployment)
        try:
            for replica in replicas:
                await stand_in.publish(replica)

            async def ready() -> bool:
                router.check_alive()
                return await answers(f"{router.url}/readyz")

            await eventually(ready, timeout_s=60.0, what="the router ready")
            yield stand_in
        finally:
            router.stop()
