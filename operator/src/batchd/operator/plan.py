"""What one converge does, as pure functions: the children a resource's spec and status render
(`children_plan`), and the status once they are applied (`status_plan`).

The reconciler reads, plans, applies what was planned, and writes the status planned from what
the API server answered; nothing here calls the API. So the same spec and status always plan the
same children, whatever history led to them, and that is tested as a property.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import kopf

from batchd.api.access import AccessPolicy
from batchd.api.pod import CANARY, STABLE, Track, child_name, selector_string
from batchd.api.revisions import batching_revision_of
from batchd.api.spec import BatchedDeployment
from batchd.api.status import BatchedDeploymentStatus, BatchingStatus, Condition, RolloutStatus
from batchd.operator import access, children, rollout, status
from batchd.operator.autoscaler import desired_replicas
from batchd.operator.resource import Resource
from batchd.operator.settings import Settings

Manifest = dict[str, Any]


@dataclass(frozen=True)
class ChildrenPlan:
    """The children to apply, in order, and the state they were rendered from."""

    bd: BatchedDeployment
    manifests: tuple[Manifest, ...]
    desired: int  # the stable Deployment's replicas
    batching: BatchingStatus
    before: RolloutStatus | None  # the rollout as the status had it
    rollout: RolloutStatus  # as planned for this spec
    access: access.AccessState | None = None  # the access Secret's, where it was read

    def applied(
        self, kind: str, track: Track, answers: Mapping[tuple[str, str], Manifest]
    ) -> Manifest | None:
        """The API server's answer for the child of `kind` on `track` (None: not applied)."""
        return answers.get((kind, child_name(self.bd.metadata.name, track)))


def children_plan(
    resource: Resource,
    settings: Settings,
    now: datetime.datetime,
    access_state: access.AccessState | None = None,
) -> ChildrenPlan:
    """The children of a resource whose spec parsed (`resource.bd`), with owner references; the
    access Secret first (the pods mount it) where its contents were read (`access_state`)."""
    bd = resource.bd
    assert bd is not None, "an invalid spec renders no children"
    before = resource.status.rollout
    spec_revision = children.revision(bd, settings)
    stable_revision = children.revision(rollout.stable_of(bd, before), settings)
    desired = desired_replicas(bd, resource.status.desired_replicas)
    planned = rollout.plan(bd, spec_revision, stable_revision, before, now, desired)
    batching = status.batching_planned(batching_revision_of(bd.spec.batching), resource.status.batching)
    # While promoting, the stable Deployment rolls to the canary's revision.
    stable = (
        rollout.canary_of(bd, planned)
        if planned.phase == rollout.PROMOTING
        else rollout.stable_of(bd, planned)
    )
    manifests = children.children(stable, settings, desired, batching.revision)
    if access_state is not None:
        manifests.insert(0, access.access_secret(bd.metadata.name, access_state))
    if planned.phase in rollout.WITH_CANARY:
        replicas = rollout.canary_replicas(planned, bd.spec.rollout.canary_steps, desired)
        canary = rollout.canary_of(bd, planned)
        manifests += children.canary_children(canary, settings, replicas, batching.revision)
    kopf.adopt(manifests, owner=kopf.Body(cast(kopf.RawBody, dict(resource.body))))
    return ChildrenPlan(bd, tuple(manifests), desired, batching, before, planned, access_state)


def canary_gone(before: RolloutStatus | None, after: RolloutStatus) -> bool:
    """Whether the canary's children go: its rollout ended (promoted, or no canary any more)."""
    return (
        before is not None and before.phase in rollout.WITH_CANARY and after.phase not in rollout.WITH_CANARY
    )


@dataclass(frozen=True)
class StatusPlan:
    """The status sections a converge writes (each replaces the stored section whole): the fields
    set on `status`."""

    status: BatchedDeploymentStatus

    @property
    def conditions(self) -> list[Condition]:
        return self.status.conditions

    @property
    def rollout(self) -> RolloutStatus | None:
        return self.status.rollout


def status_plan(
    resource: Resource,
    plan: ChildrenPlan,
    answers: Mapping[tuple[str, str], Manifest],
    settings: Settings,
    now: datetime.datetime,
) -> StatusPlan:
    """The status once the plan's children were applied (`answers`: the API server's, by kind and
    name): replica counts and conditions from the stable Deployment, the rollout moved on when the
    stable Deployment has rolled to the promoted revision."""
    bd, generation = plan.bd, resource.generation
    stable_deployment = plan.applied("Deployment", STABLE, answers)
    after = plan.rollout
    if after.phase == rollout.PROMOTING and status.rolled_out(
        stable_deployment, plan.desired, after.canary_revision
    ):
        after = rollout.promoted(after)
    if after.phase in rollout.WITH_CANARY:
        after = after.model_copy(
            update={"canary": status.canary_replicas(plan.applied("Deployment", CANARY, answers))}
        )
    autoscaling = resource.status.autoscaling
    found = status.conditions_from_deployment(
        stable_deployment,
        desired=plan.desired,
        generation=generation,
        zero_reason=status.zero_reason(
            bd.spec.autoscaling is not None,
            settings.routers_run,
            autoscaling.last_scale_reason if autoscaling else "",
        ),
    )
    if bd.spec.rollout.strategy == "canary" or after.phase != rollout.NONE:
        found = rollout.conditions(found, after, generation)
    if plan.access is not None:
        found = [*found, access.access_condition(AccessPolicy.of(bd.spec), plan.access, generation)]
    conditions = status.stamped(resource.status.conditions, found, status.stamp(now))
    stable = rollout.stable_of(bd, after)
    replicas, ready = status.counts(stable_deployment)
    return StatusPlan(
        BatchedDeploymentStatus(
            replicas=replicas,
            ready_replicas=ready,
            observed_generation=generation,
            selector=selector_string(bd.metadata.name),
            url=children.service_url(bd, resource.namespace, settings),
            model=stable.spec.model.source or stable.spec.model.handler or "",
            revision=children.revision(stable, settings),
            desired_replicas=plan.desired,
            conditions=conditions,
            batching=plan.batching,
            rollout=after,
        )
    )


def failed_status_plan(resource: Resource, found: list[Condition], now: datetime.datetime) -> StatusPlan:
    """The status of a spec that cannot be served, or whose children the API server refused:
    the conditions say why; everything else stays as it was (nothing new was applied)."""
    conditions = status.stamped(resource.status.conditions, found, status.stamp(now))
    return StatusPlan(BatchedDeploymentStatus(observed_generation=resource.generation, conditions=conditions))
