"""The poller's writes of `status.batching`, against a real API server.

The poller counts which batching revision each replica runs from the resource as its watch last
saw it. When a new spec.batching has moved the revision since (converge writes the new one), a
count made against the old revision must not be written back over it: the replicas would then be
reported as running the new batching before they had it, or the new revision would be lost.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import aiohttp.web
import yaml

from batchd.operator.cluster import Cluster
from batchd.operator.poller import Poller
from batchd.operator.reconcile import Reconciler
from batchd.operator.replicas import ReplicaPod
from batchd.operator.settings import Settings
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.manifests import manifest


def batching_status(revision: int) -> dict[str, Any]:
    return {"revision": revision, "ready_replicas_applied": 0, "applied": False}


@contextlib.asynccontextmanager
async def replica_reporting(revision: int) -> AsyncIterator[ReplicaPod]:
    """A replica's `/load` on loopback, saying it runs batching `revision`."""

    async def load(_: aiohttp.web.Request) -> aiohttp.web.Response:
        report = {"ready": True, "queued_items": 0, "running_items": 0, "batching_revision": revision}
        return aiohttp.web.json_response(report)

    app = aiohttp.web.Application()
    app.router.add_get("/load", load)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield ReplicaPod("retuned-0", "127.0.0.1", port, ready=True, terminating=False, deletion_cost=None)
    finally:
        await runner.cleanup()


async def poll(
    control_plane: ControlPlane, namespace: str, seen: dict[str, Any], replica: ReplicaPod
) -> None:
    cluster = await Cluster.connect(Settings(kubeconfig=str(control_plane.admin_kubeconfig)))
    poller = Poller.of(cluster, Reconciler(cluster))
    try:
        poller.track_pod((namespace, "retuned"), replica.name, replica)
        await poller.poll(cluster.resource(seen))
    finally:
        await poller.close()
        await cluster.close()


def status_of(control_plane: ControlPlane, namespace: str) -> dict[str, Any]:
    found = control_plane.kubectl("get", "bd", "retuned", "-n", namespace, "-o", "json").stdout
    batching: dict[str, Any] = json.loads(found)["status"]["batching"]
    return batching


async def test_a_count_against_an_older_revision_leaves_the_new_one(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    document = yaml.safe_dump(manifest("retuned"))
    control_plane.kubectl("apply", "-n", kube_namespace, "-f", "-", input=document)
    created = json.loads(
        control_plane.kubectl("get", "bd", "retuned", "-n", kube_namespace, "-o", "json").stdout
    )
    # What converge wrote for the new spec.batching; the loop still holds the resource as it was.
    new = {"status": {"batching": batching_status(2)}}
    control_plane.kubectl(
        "patch",
        "bd",
        "retuned",
        "-n",
        kube_namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(new),
    )
    seen = {**created, "status": {"batching": batching_status(1)}}

    async with replica_reporting(revision=1) as replica:
        await poll(control_plane, kube_namespace, seen, replica)
    assert status_of(control_plane, kube_namespace) == batching_status(2)

    # Counted against the revision the server holds, the count is written.
    async with replica_reporting(revision=2) as replica:
        await poll(control_plane, kube_namespace, {**created, **new}, replica)
    assert status_of(control_plane, kube_namespace) == {
        **batching_status(2),
        "ready_replicas_applied": 1,
        "applied": True,
    }
