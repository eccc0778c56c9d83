"""Autoscaling, fed by the poller's readings: the autoscaler's count applied to a resource.

At each poll the autoscaler (`autoscaler`, pure) decides from the load the ready replicas report
and what the routers hold. What it saw goes to `status.autoscaling` (at most every
`autoscaling_status_interval_s`); a new count goes to `status.desired_replicas`, the least loaded
pods are marked cheapest to delete before a scale-down (the ReplicaSet controller removes those
first, and they drain like any pod on SIGTERM), the resource is converged (its Deployment applied
with the new count), and an event records it.
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass, field
from typing import cast

import kopf

from batchd.api.status import AutoscalingStatus, BatchedDeploymentStatus
from batchd.operator.autoscaler import Autoscaler, Decision, Held, Policy
from batchd.operator.cluster import Cluster
from batchd.operator.metrics import SCALES, forget_load, record_load, record_replicas
from batchd.operator.reconcile import Reconciler
from batchd.operator.replicas import ReplicaLoad
from batchd.operator.resource import Key, Resource
from batchd.operator.status import stamp

logger = logging.getLogger(__name__)


@dataclass
class Scaling:
    cluster: Cluster
    reconciler: Reconciler
    autoscalers: dict[Key, Autoscaler] = field(default_factory=dict)
    _seen_written: dict[Key, float] = field(default_factory=dict)  # when status.autoscaling last was

    def forget(self, key: Key) -> None:
        self.autoscalers.pop(key, None)
        self._seen_written.pop(key, None)
        forget_load(*key)

    def unobserved(self, key: Key) -> None:
        """Some router could not say what it holds: no poll counts as idle."""
        self.autoscalers.setdefault(key, Autoscaler()).unobserved()

    async def feed(self, resource: Resource, loads: list[ReplicaLoad], held: Held) -> Decision | None:
        """Decide from one poll's `loads` and what the routers `held`; returns the decision, if one
        was made."""
        bd, key = resource.bd, resource.key
        policy = Policy.of(bd) if bd is not None else None
        if policy is None or bd is None:
            self.autoscalers.pop(key, None)
            return None
        current = resource.status.desired_replicas
        if current is None:
            current = policy.bounded(bd.spec.num_replicas)
        autoscaler = self.autoscalers.setdefault(key, Autoscaler())
        if not (loads or held.requests or current == 0):
            autoscaler.unobserved()  # replicas asked for, none has said anything yet
            return None
        load = sum(replica.counted(policy.count_sheddable) for replica in loads)
        uncounted = sum(replica.items for replica in loads) - load
        decision = autoscaler.decide(policy, current, load, len(loads), time.monotonic(), held, uncounted)
        record_load(*key, load, decision.recommended)
        before = resource.status.autoscaling or AutoscalingStatus()
        seen = before.model_copy(
            update={
                "load": load,
                "ready_replicas": len(loads),
                "target_ongoing_items": policy.target_ongoing_items,
                "recommended_replicas": decision.recommended,
                "held_requests": held.requests,
            }
        )
        if decision.replicas == current:
            await self._record_seen(resource, before, seen)
            return decision
        await self._scale(resource, current, decision, loads, seen)
        return decision

    async def _record_seen(
        self, resource: Resource, before: AutoscalingStatus, seen: AutoscalingStatus
    ) -> None:
        """What the autoscaler saw, for people reading the status: at most every interval."""
        now = time.monotonic()
        refresh_s = self.cluster.settings.autoscaling_status_interval_s
        if seen == before or now - self._seen_written.get(resource.key, -refresh_s) < refresh_s:
            return
        async with self.cluster.locks[resource.key]:
            await self.cluster.write_status(resource, BatchedDeploymentStatus(autoscaling=seen))
        self._seen_written[resource.key] = now

    async def _scale(
        self,
        resource: Resource,
        current: int,
        decision: Decision,
        loads: list[ReplicaLoad],
        seen: AutoscalingStatus,
    ) -> None:
        scaled = seen.model_copy(
            update={
                "last_scale_time": stamp(datetime.datetime.now(datetime.UTC)),
                "last_scale_reason": decision.reason,
            }
        )
        # Guarded: a count decided from a resource read before another write moved it is not written.
        guarded = ["desired_replicas"] if "desired_replicas" in resource.stored_status else []
        async with self.cluster.locks[resource.key]:
            if decision.replicas < current:
                for replica in loads:
                    if replica.pod.deletion_cost != replica.items:
                        await self.cluster.set_deletion_cost(
                            resource.namespace, replica.pod.name, replica.items
                        )
            written = await self.cluster.write_status(
                resource,
                BatchedDeploymentStatus(autoscaling=scaled, desired_replicas=decision.replicas),
                guarded,
            )
        if not written:
            return
        self._seen_written[resource.key] = time.monotonic()
        SCALES.labels(direction="up" if decision.replicas > current else "down").inc()
        record_replicas(*resource.key, decision.replicas, resource.status.ready_replicas)
        kopf.event(
            cast(kopf.Body, resource.body),
            type="Normal",
            reason=scale_event_reason(current, decision.replicas),
            message=f"{current} -> {decision.replicas} replicas: {decision.reason}",
        )
        # The Deployment follows the status' count.
        await self.reconciler.converge(*resource.key, logger)


def scale_event_reason(current: int, replicas: int) -> str:
    """The event's reason: going to or coming back from zero are told apart from other scales."""
    if replicas == 0:
        return "ScaledToZero"
    if current == 0:
        return "ScaledFromZero"
    return "ScaledUp" if replicas > current else "ScaledDown"
