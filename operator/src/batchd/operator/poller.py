"""The poller: one loop that reads every serving replica, and whose readings feed the batching
revision, autoscaling and the canary's judge.

Every `replica_poll_interval_s` it reads each serving replica's own `GET /load` (and `/metrics`
when a canary step is due to be judged), then: records which batching revision the ready replicas
run (`status.batching`, for live retuning), feeds the autoscaler (`scaling`) and the judge
(`judge`). When routers run, the same poll reads what they hold (`routers`): a deployment at zero
replicas wakes for a held request, and goes to zero only when nothing is held for it. It learns the
resources and their pods from the watch events (`track`, `track_pod`), so no poll lists anything.
One loop rather than a Kopf daemon per resource: Kopf gives every resource with a daemon a
finalizer, and deleting a resource should never wait for the operator.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from batchd.api.kube_connection import ApiError
from batchd.api.status import BatchedDeploymentStatus
from batchd.operator import status
from batchd.operator.autoscaler import NOTHING_HELD, Held
from batchd.operator.cluster import Cluster
from batchd.operator.judge import Judge
from batchd.operator.reconcile import InvalidSpec, Reconciler
from batchd.operator.replicas import ReplicaLoad, ReplicaPod, read_replicas
from batchd.operator.resource import Key, Resource
from batchd.operator.routers import list_router_pods, read_held
from batchd.operator.scaling import Scaling

logger = logging.getLogger(__name__)


@dataclass
class Poller:
    """The resources and replica pods the watches reported, and one loop that polls them all."""

    cluster: Cluster
    reconciler: Reconciler
    session: aiohttp.ClientSession
    scaling: Scaling
    judge: Judge
    resources: dict[Key, Resource] = field(default_factory=dict)
    pods: dict[Key, dict[str, ReplicaPod]] = field(default_factory=dict)  # by resource, by pod name
    # What the routers held at the last poll; None when some router could not say.
    held: dict[Key, Held] | None = field(default_factory=dict)
    _loop_task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, cluster: Cluster, reconciler: Reconciler) -> Poller:
        return cls(
            cluster,
            reconciler,
            aiohttp.ClientSession(),
            Scaling(cluster, reconciler),
            Judge(cluster, reconciler),
        )

    def track(self, key: Key, body: Mapping[str, Any] | None) -> None:
        """A resource as its watch saw it; None once it is deleted."""
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            self.resources.pop(key, None)
            self.scaling.forget(key)
            self.judge.forget(key)
        else:
            self.resources[key] = self.cluster.resource(body)

    def track_pod(self, owner: Key, name: str, pod: ReplicaPod | None) -> None:
        """A replica pod as its watch saw it; None once it is deleted."""
        pods = self.pods.setdefault(owner, {})
        if pod is None:
            pods.pop(name, None)
            if not pods:
                del self.pods[owner]
        else:
            pods[name] = pod

    def ensure_running(self) -> None:
        """Start the loop, once (Kopf hands each resource a copy of the memo, not this object's task)."""
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self.run(), name="batchd-poller")

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await self.session.close()

    async def run(self) -> None:
        """Every poll interval, look at every resource at once (their replicas answer in parallel);
        in between, while some resource is at zero replicas, read the routers every wake interval
        and poll at once each resource at zero that a router holds a request for: a cold start
        should not wait for the next full poll."""
        loop = asyncio.get_running_loop()
        settings = self.cluster.settings
        next_full = loop.time()
        while True:
            if loop.time() >= next_full:
                next_full = loop.time() + settings.replica_poll_interval_s
                self.held = await self._read_routers()
                await asyncio.gather(*(self._poll_logged(key) for key in list(self.resources)))
            elif asleep := self._at_zero():
                held = await self._read_routers() or {}
                woken = [key for key in asleep if held.get(key, NOTHING_HELD).requests]
                if woken:
                    self.held = {**(self.held or {}), **{key: held[key] for key in woken}}
                    await asyncio.gather(*(self._poll_logged(key) for key in woken))
            # A deployment may go to zero at any moment (its status arrives by watch): look again
            # at least every wake interval.
            await asyncio.sleep(max(0.0, min(next_full - loop.time(), settings.wake_poll_interval_s)))

    def _at_zero(self) -> list[Key]:
        """The autoscaled resources whose replicas the operator last set to zero."""
        return [
            key
            for key, resource in self.resources.items()
            if resource.status.desired_replicas == 0
            and resource.bd is not None
            and resource.bd.spec.autoscaling
        ]

    async def _read_routers(self) -> dict[Key, Held] | None:
        """What the routers hold, per deployment: nothing when no router runs, None when they could
        not all be read (then no deployment counts this poll as idle)."""
        settings = self.cluster.settings
        if not settings.routers_run or not any(
            resource.bd is not None and resource.bd.spec.autoscaling for resource in self.resources.values()
        ):
            return {}  # only the autoscaler acts on what is held
        try:
            pods = await list_router_pods(
                self.cluster.api, settings.router_namespace, settings.router_selector
            )
        except ApiError as error:
            logger.warning("listing the router pods failed: %s", error)
            return None
        return await read_held(self.session, pods, settings.replica_poll_timeout_s)

    async def _poll_logged(self, key: Key) -> None:
        resource = self.resources.get(key)
        if resource is None or resource.bd is None:
            return  # converge reports an invalid spec; there is nothing to read for it
        try:
            await self.poll(
                resource, (self.held or {}).get(key, NOTHING_HELD), routers_said=self.held is not None
            )
        except InvalidSpec:
            pass  # the spec changed under this poll; converge reported it
        except ApiError as error:  # the next poll tries again
            logger.warning("polling %s/%s failed: %s", *key, error)
        except Exception:  # one resource's trouble must not stop the loop for all the others
            logger.exception("polling %s/%s failed", *key)

    async def poll(self, resource: Resource, held: Held = NOTHING_HELD, *, routers_said: bool = True) -> None:
        """Read the resource's replicas once and feed what they said to each consumer."""
        started = time.monotonic()
        pods = list(self.pods.get(resource.key, {}).values())
        wants_answers = self.judge.wants_answers(resource)
        readings = await read_replicas(
            self.session, pods, self.cluster.settings.replica_poll_timeout_s, answers=wants_answers
        )
        loads = [reading.load for reading in readings if reading.load is not None]
        await self._record_batching(resource, loads)
        if not routers_said:
            self.scaling.unobserved(resource.key)
        await self.scaling.feed(resource, loads, held)
        await self.judge.feed(resource, pods, readings if wants_answers else None)
        logger.debug("polled %s/%s in %.3f s", *resource.key, time.monotonic() - started)

    async def _record_batching(self, resource: Resource, loads: list[ReplicaLoad]) -> None:
        """`status.batching` as the ready replicas report it, only while it still names the
        revision they were counted against: the poll reads a resource its watch saw, and a new
        spec.batching may have moved the revision since (converge's), which an older count must
        not put back."""
        batching = resource.status.batching
        if batching is None:
            return
        counted = status.batching_applied(batching, [load.batching_revision for load in loads])
        if counted == batching:
            return
        async with self.cluster.locks[resource.key]:
            written = await self.cluster.write_status(
                resource, BatchedDeploymentStatus(batching=counted), guarded=["batching"]
            )
        if not written:
            logger.debug(
                "%s/%s: batching revision moved since this poll read it; counted next poll", *resource.key
            )
