"""The scaling loop: every poll interval, every ready replica's load, and the autoscaler applied to it.

Every `replica_poll_interval_s` the operator reads each ready replica's own load (`replicas`),
then: records which batching revision the replicas run (`status.batching`, for live
retuning), and with `spec.autoscaling` asks the autoscaler for a count and applies it: the
least loaded pods are marked cheapest to delete before a scale-down (the ReplicaSet controller
removes those first, and they drain like any pod on SIGTERM), the Deployment's replicas change,
the status says why, and an event records it. When routers run, the same poll reads what they
hold (`routers`): a deployment at zero replicas wakes for a held request, and goes to zero only
when nothing is held for it.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp
import kopf

from batchd.api.kube_connection import ApiError, resource_path
from batchd.api.manifest import ManifestError, parse_manifest
from batchd.operator import children, status
from batchd.operator.autoscaler import NOTHING_HELD, Autoscaler, Decision, Held, Policy
from batchd.operator.metrics import SCALES, forget_load, record_load, record_replicas
from batchd.operator.reconcile import Reconciler
from batchd.operator.replicas import DELETION_COST_ANNOTATION, ReplicaLoad, ReplicaPod, read_loads
from batchd.operator.rollout_loop import RolloutJudge
from batchd.operator.routers import list_router_pods, read_held

logger = logging.getLogger(__name__)


Key = tuple[str, str]  # (namespace, name) of a BatchedDeployment


@dataclass
class ScalingLoop:
    """The resources and replica pods the watches reported, and one loop that polls them all."""

    reconciler: Reconciler
    session: aiohttp.ClientSession
    resources: dict[Key, dict[str, Any]] = field(default_factory=dict)  # the last body of each
    pods: dict[Key, dict[str, ReplicaPod]] = field(default_factory=dict)  # by resource, by pod name
    autoscalers: dict[Key, Autoscaler] = field(default_factory=dict)
    judge: RolloutJudge | None = None  # canary rollouts, judged at the same polls
    _loop_task: asyncio.Task[None] | None = None
    _seen_written: dict[Key, float] = field(default_factory=dict)  # when status.autoscaling last was
    # What the routers held at the last poll; None when some router could not say.
    held: dict[Key, Held] | None = field(default_factory=dict)

    def track(self, namespace: str, name: str, body: dict[str, Any] | None) -> None:
        """A resource as its watch saw it; None once it is deleted."""
        key = (namespace, name)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            self.resources.pop(key, None)
            self.autoscalers.pop(key, None)
            self._seen_written.pop(key, None)
            forget_load(namespace, name)
            if self.judge is not None:
                self.judge.forget(key)
        else:
            self.resources[key] = body

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
            self._loop_task = asyncio.create_task(self.run(), name="batchd-scaling-loop")

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
        settings = self.reconciler.settings
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
            for key, body in self.resources.items()
            if (body.get("status") or {}).get("desired_replicas") == 0
            and (body.get("spec") or {}).get("autoscaling")
        ]

    async def _read_routers(self) -> dict[Key, Held] | None:
        """What the routers hold, per deployment: nothing when no router runs, None when they could
        not all be read (then no deployment counts this poll as idle)."""
        settings = self.reconciler.settings
        if not settings.routers_run or not any(
            body.get("spec", {}).get("autoscaling") for body in self.resources.values()
        ):
            return {}  # only the autoscaler acts on what is held
        try:
            pods = await list_router_pods(
                self.reconciler.api, settings.router_namespace, settings.router_selector
            )
        except ApiError as error:
            logger.warning("listing the router pods failed: %s", error)
            return None
        return await read_held(self.session, pods, settings.replica_poll_timeout_s)

    async def _poll_logged(self, key: Key) -> None:
        body = self.resources.get(key)
        if body is None:
            return
        try:
            if self.held is None:
                self.autoscalers.setdefault(key, Autoscaler()).unobserved()
            held = (self.held or {}).get(key, NOTHING_HELD)
            pods = list(self.pods.get(key, {}).values())
            await self.poll(*key, body, pods, held)
            if self.judge is not None:
                await self.judge.tick(key, body, pods)
        except ApiError as error:  # the next poll tries again
            logger.warning("polling %s/%s failed: %s", *key, error)
        except Exception:  # one resource's trouble must not stop the loop for all the others
            logger.exception("polling %s/%s failed", *key)

    async def poll(
        self,
        namespace: str,
        name: str,
        body: Mapping[str, Any],
        pods: Sequence[ReplicaPod],
        held: Held = NOTHING_HELD,
    ) -> Decision | None:
        """Read the replicas once and act on it; returns the autoscaler's decision, if it made one."""
        document = {key: body.get(key) for key in ("apiVersion", "kind", "metadata", "spec")}
        try:
            bd = parse_manifest(document, origin=f"{namespace}/{name}")
        except ManifestError:
            return None  # converge reports it; there is nothing to scale for a spec it refused
        settings = self.reconciler.settings
        loads = await read_loads(self.session, pods, settings.replica_poll_timeout_s)
        old = dict(body.get("status") or {})
        updates: dict[str, Any] = {}
        batching: dict[str, Any] | None = None
        if old.get("batching"):
            batching = status.batching_applied(old["batching"], [load.batching_revision for load in loads])
            if batching == old["batching"]:
                batching = None

        decision: Decision | None = None
        policy = Policy.of(bd)
        if policy is None:
            self.autoscalers.pop((namespace, name), None)
        else:
            current = old.get("desired_replicas")
            if not isinstance(current, int):
                current = policy.bounded(bd.spec.num_replicas)
            if loads or held.requests or current == 0:
                decision = await self._autoscale(namespace, name, body, current, policy, loads, held, updates)
            else:  # replicas asked for, none has said anything yet: nothing to decide on
                self.autoscalers.setdefault((namespace, name), Autoscaler()).unobserved()
        if updates or batching:
            async with self.reconciler.locks[(namespace, name)]:
                if updates:
                    await self._patch_status(namespace, name, updates)
                if batching:
                    await self._patch_batching(namespace, name, batching)
        return decision

    async def _autoscale(
        self,
        namespace: str,
        name: str,
        body: Mapping[str, Any],
        current: int,
        policy: Policy,
        loads: list[ReplicaLoad],
        held: Held,
        updates: dict[str, Any],
    ) -> Decision:
        load = sum(replica.counted(policy.count_sheddable) for replica in loads)
        uncounted = sum(replica.items for replica in loads) - load
        old = body.get("status") or {}
        autoscaler = self.autoscalers.setdefault((namespace, name), Autoscaler())
        decision = autoscaler.decide(policy, current, load, len(loads), time.monotonic(), held, uncounted)
        record_load(namespace, name, load, decision.recommended)

        seen = {
            "load": load,
            "ready_replicas": len(loads),
            "target_ongoing_items": policy.target_ongoing_items,
            "recommended_replicas": decision.recommended,
            "held_requests": held.requests,
        }
        before = old.get("autoscaling") or {}
        key = (namespace, name)
        now = time.monotonic()
        refresh_s = self.reconciler.settings.autoscaling_status_interval_s
        stale = now - self._seen_written.get(key, -refresh_s) >= refresh_s
        if stale and any(before.get(field) != value for field, value in seen.items()):
            updates["autoscaling"] = {**before, **seen}
            self._seen_written[key] = now
        if decision.replicas == current:
            return decision

        updates["autoscaling"] = {
            **before,
            **seen,
            "last_scale_time": status.stamp(datetime.datetime.now(datetime.UTC)),
            "last_scale_reason": decision.reason,
        }
        self._seen_written[key] = now
        updates["desired_replicas"] = decision.replicas
        async with self.reconciler.locks[(namespace, name)]:
            if decision.replicas < current:
                await self._mark_deletion_costs(namespace, loads)
            # The status first: a converge that runs next reads the new count from it.
            await self._patch_status(namespace, name, updates)
            updates.clear()
            deployment = resource_path("apps/v1", "deployments", namespace, name)
            await self.reconciler.api.merge_patch(deployment, children.replicas_patch(decision.replicas))
        direction = "up" if decision.replicas > current else "down"
        SCALES.labels(direction=direction).inc()
        record_replicas(namespace, name, decision.replicas, int(old.get("ready_replicas") or 0))
        kopf.event(
            cast(kopf.Body, body),
            type="Normal",
            reason=scale_event_reason(current, decision.replicas),
            message=f"{current} -> {decision.replicas} replicas: {decision.reason}",
        )
        return decision

    async def _mark_deletion_costs(self, namespace: str, loads: list[ReplicaLoad]) -> None:
        """Each pod's deletion cost is its load: the ReplicaSet controller removes the cheapest first."""
        for replica in loads:
            if replica.pod.deletion_cost == replica.items:
                continue
            path = resource_path("v1", "pods", namespace, replica.pod.name)
            patch = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(replica.items)}}}
            try:
                await self.reconciler.api.merge_patch(path, patch)
            except ApiError as error:
                if error.status != 404:  # gone already: one fewer to choose from
                    raise

    async def _patch_status(self, namespace: str, name: str, updates: dict[str, Any]) -> None:
        await self.reconciler.api.merge_patch(
            self.reconciler.parent_path(namespace, name, "status"), {"status": updates}
        )

    async def _patch_batching(self, namespace: str, name: str, batching: dict[str, Any]) -> None:
        """`status.batching` as the replicas reported it, only while it still names the revision
        they were counted against: the poll reads a cached resource, and a new spec.batching may
        have moved the revision meanwhile (converge's), which an older count must not put back."""
        operations = [
            {"op": "test", "path": "/status/batching/revision", "value": batching["revision"]},
            {"op": "replace", "path": "/status/batching", "value": batching},
        ]
        try:
            await self.reconciler.api.json_patch(
                self.reconciler.parent_path(namespace, name, "status"), operations
            )
        except ApiError as error:
            if error.status != 422:
                raise
            logger.debug(
                "%s/%s: batching revision moved since this poll read it; counted next poll", namespace, name
            )


def scale_event_reason(current: int, replicas: int) -> str:
    """The event's reason: going to or coming back from zero are told apart from other scales."""
    if replicas == 0:
        return "ScaledToZero"
    if current == 0:
        return "ScaledFromZero"
    return "ScaledUp" if replicas > current else "ScaledDown"
