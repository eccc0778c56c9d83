"""The router as it runs in a cluster, on this machine: its own process, on a ServiceAccount that
holds the router's Role, reading BatchedDeployments and EndpointSlices from a real API server with
no node (`batchd.testing.kubernetes.routed`), where a benchmark publishes replicas as the
EndpointSlice controller would once their pods are ready. Replicas listen on the cluster's address
(`ControlPlane.address`): the API server refuses loopback addresses in a slice.

Every wait is a bounded poll on state; nothing sleeps to synchronise.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.routed import RouterNamespaces
from batchd.testing.servers import ServerProcess


@dataclass
class Routed:
    """The router process, and the namespace of the API server it reads `deployment` from."""

    namespaces: RouterNamespaces
    router: ServerProcess
    deployment: str

    async def publish(self, replica: ServerProcess) -> None:
        """`replica` is ready: its slice appears, as the EndpointSlice controller would write it (a
        slice has one port, and each replica has its own)."""
        address = f"{replica.host}:{replica.port}"
        name = f"{self.deployment}-{replica.port}"
        await self.namespaces.put_slice(self.namespaces.slice(self.deployment, [address], name=name))

    async def held(self) -> int:
        """Requests the router holds for the deployment now (its `GET /held`)."""
        async with aiohttp.ClientSession() as client, client.get(f"{self.router.admin_url}/held") as response:
            document = await response.json()
        return sum(int(entry["held_requests"]) for entry in document["deployments"])


@asynccontextmanager
async def routed(
    cluster: ControlPlane,
    workdir: Path,
    deployment: str,
    replicas: Sequence[ServerProcess] = (),
    **settings: Any,
) -> AsyncIterator[Routed]:
    """`deployment` (a BatchedDeployment; the model is its name) and the slices of `replicas` in
    namespaces of their own, and a router process reading them (`settings`: RouterSettings fields),
    yielded once the router is ready; the router is stopped and the namespaces deleted after."""
    async with RouterNamespaces(cluster, workdir) as namespaces:
        await namespaces.create_deployment(deployment)
        async with namespaces.router(**settings) as router:
            stand_in = Routed(namespaces, router, deployment)
            for replica in replicas:
                await stand_in.publish(replica)
            yield stand_in
