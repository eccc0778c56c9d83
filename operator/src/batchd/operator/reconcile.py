"""Bring one BatchedDeployment's children and status in line with its spec: read, plan, apply, write.

Every converge starts from what the API server has now: the resource is read, `plan` renders its
children from the spec and the status, each child is applied (Server-Side Apply), and the status
planned from the API server's answers is written. Nothing is created "because I remember", so a
restarted operator, a deleted child and an edited child all end the same way. Converges of one
resource are serialised by its lock, so two triggers (its own watch and a child's) never race to
announce the same transition twice.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import kopf

from batchd.api.access import AccessPolicy
from batchd.api.kube_connection import ApiError
from batchd.api.pod import access_secret_name
from batchd.api.spec import API_VERSION
from batchd.api.status import RolloutStatus
from batchd.operator import access, plan, rollout, status
from batchd.operator.cluster import Cluster
from batchd.operator.metrics import (
    RECONCILE_DURATION,
    RECONCILES,
    forget,
    record_replicas,
    record_rollout_state,
)
from batchd.operator.resource import Resource

# The API server refused what we sent: retrying the same spec cannot help.
REFUSED = (400, 422)


class InvalidSpec(kopf.PermanentError):
    """The spec cannot be served; the Degraded condition says why."""


@dataclass(frozen=True)
class Outcome:
    name: str  # success, invalid or refused (the reconcile metric's label)
    message: str = ""
    promoted: bool = False  # a promotion ended: the spec may already ask for the next rollout


class Reconciler:
    """Converges resources through the `Cluster`; one instance for the operator's lifetime."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def converge(self, namespace: str, name: str, logger: logging.Logger | kopf.Logger) -> str | None:
        """Reconcile one resource; returns the outcome, or None if the resource is gone.

        Raises `InvalidSpec` when the spec cannot be served (after saying so in the status).
        """
        async with self.cluster.locks[(namespace, name)]:
            started = time.monotonic()
            try:
                outcome = await self._converge(namespace, name)
                if outcome is not None and outcome.promoted:
                    outcome = await self._converge(namespace, name)
            except Exception:
                RECONCILES.labels(outcome="error").inc()
                raise
            finally:
                RECONCILE_DURATION.observe(time.monotonic() - started)
        if outcome is None:
            return None
        RECONCILES.labels(outcome=outcome.name).inc()
        if outcome.name in ("invalid", "refused"):
            logger.warning(outcome.message)
            raise InvalidSpec(outcome.message)
        return outcome.name

    async def _converge(self, namespace: str, name: str) -> Outcome | None:
        resource = await self.cluster.read(namespace, name)
        if resource is None or resource.deleting:
            forget(namespace, name)
            self.cluster.forget((namespace, name))
            return None  # deleted: the owner references take the children away
        now = datetime.datetime.now(datetime.UTC)
        settings = self.cluster.settings
        if resource.bd is None:
            conditions = status.conditions_for_invalid_spec(resource.invalid, generation=resource.generation)
            await self._write(resource, plan.failed_status_plan(resource, conditions, now))
            return Outcome("invalid", resource.invalid)

        children = plan.children_plan(resource, settings, now, await self._access(resource))
        answers: dict[tuple[str, str], dict[str, Any]] = {}
        for manifest in children.manifests:
            kind = manifest["kind"]
            try:
                answers[(kind, manifest["metadata"]["name"])] = await self.cluster.apply(manifest, namespace)
            except ApiError as error:
                if error.status not in REFUSED:
                    raise
                message = f"the API server refused the {kind}: {error.message}"
                conditions = status.conditions_for_refused_child(
                    kind, message, generation=resource.generation
                )
                await self._write(resource, plan.failed_status_plan(resource, conditions, now))
                return Outcome("refused", message)

        if not settings.network_policy:
            await self.cluster.remove_network_policies(namespace, name)
        planned = plan.status_plan(resource, children, answers, settings, now)
        after = planned.rollout or RolloutStatus()
        if plan.canary_gone(children.before, after):
            await self.cluster.delete_canary(namespace, name)
        await self._write(resource, planned)
        record_replicas(namespace, name, children.desired, planned.status.ready_replicas)
        record_rollout_state(
            namespace, name, after.phase, after.canary_percent, after.phase in rollout.JUDGED
        )
        announce_rollout(resource.body, children.before, after)
        promoted = after.phase == rollout.PROMOTED and children.rollout.phase == rollout.PROMOTING
        return Outcome("success", promoted=promoted)

    async def _access(self, resource: Resource) -> access.AccessState:
        """What the access Secret holds after this converge: its signing key read back (never made
        twice), the digests of each tenant's API keys Secret as it is now. The Secrets read are
        noted, so that a change to one of them converges this deployment."""
        assert resource.bd is not None
        policy = AccessPolicy.of(resource.bd.spec)
        named = access.user_secrets_named(policy)
        self.cluster.reads_secrets((resource.namespace, resource.name), named)
        existing = await self.cluster.read_secret(resource.namespace, access_secret_name(resource.name))
        found = {name: await self.cluster.read_secret(resource.namespace, name) for name in sorted(named)}
        return access.access_state(policy, existing, found)

    async def _write(self, resource: Resource, planned: plan.StatusPlan) -> None:
        """The planned status sections, then an event for each condition that moved."""
        await self.cluster.write_status(resource, planned.status)
        for change in status.transitions(resource.status.conditions, planned.conditions):
            kopf.event(
                cast(kopf.Body, resource.body),
                type="Warning" if change.warning else "Normal",
                reason=change.reason,
                message=f"{change.type}={change.status}: {change.message}".rstrip(": "),
            )


def announce_rollout(
    body: Mapping[str, Any], before: RolloutStatus | None, after: RolloutStatus | None
) -> None:
    """An event for a rollout that moved (a step, a phase); nothing when it did not."""
    change = rollout.announcement(before, after)
    if change is not None and after is not None:
        warning, reason = change
        kopf.event(
            cast(kopf.Body, body),
            type="Warning" if warning else "Normal",
            reason=reason,
            message=after.message,
        )


def owner_of(child: Mapping[str, Any]) -> str | None:
    """The name of the BatchedDeployment that controls this child, from its owner references."""
    for reference in child.get("metadata", {}).get("ownerReferences", []) or []:
        if reference.get("kind") == "BatchedDeployment" and reference.get("apiVersion") == API_VERSION:
            return str(reference.get("name"))
    return None
