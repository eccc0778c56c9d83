"""The status of a BatchedDeployment, derived from its Deployments' own statuses: pure functions.

Conditions follow the Kubernetes API conventions: `type`, `status` ("True"/"False"/"Unknown"),
a CamelCase `reason`, a human `message`, and a `lastTransitionTime` that moves only when the
status does. `transitions()` tells the handlers which changes deserve a Kubernetes event.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchd.api.pod import REVISION_LABEL
from batchd.api.status import BatchingStatus, CanaryReplicas, Condition, ConditionType

Manifest = Mapping[str, Any]


@dataclass(frozen=True)
class Transition:
    """A condition that changed: what the event says."""

    type: str
    status: str
    reason: str
    message: str

    @property
    def warning(self) -> bool:
        return (
            (self.type in ("Degraded", "RolledBack") and self.status == "True")
            or (self.type == "Ready" and self.status == "False" and self.reason != "ScaledToZero")
            or (self.type == "AccessReady" and self.status == "False")
        )


def condition(type_: ConditionType, ok: bool, reason: str, message: str, generation: int) -> Condition:
    return Condition(
        type=type_,
        status="True" if ok else "False",
        reason=reason,
        message=message,
        observedGeneration=generation,
    )


def _deployment_condition(deployment: Manifest, type_: str) -> Mapping[str, Any]:
    for found in deployment.get("status", {}).get("conditions", []) or []:
        if found.get("type") == type_:
            return dict(found)
    return {}


def failure_of(deployment: Manifest) -> tuple[str, str] | None:
    """(reason, message) of a Deployment's own failure: its rollout past its progress deadline, or
    pods it cannot create; None when it reports none."""
    stuck = _deployment_condition(deployment, "Progressing")
    if stuck.get("reason") == "ProgressDeadlineExceeded":
        return "ProgressDeadlineExceeded", str(stuck.get("message") or "the rollout is stuck")
    failure = _deployment_condition(deployment, "ReplicaFailure")
    if failure.get("status") == "True":
        return str(failure.get("reason") or "ReplicaFailure"), str(failure.get("message") or "")
    return None


def counts(deployment: Manifest | None) -> tuple[int, int]:
    """(replicas, ready replicas) as a Deployment's controller last counted them."""
    found = (deployment or {}).get("status", {}) or {}
    return int(found.get("replicas", 0) or 0), int(found.get("readyReplicas", 0) or 0)


def conditions_from_deployment(
    deployment: Manifest | None, *, desired: int, generation: int, zero_reason: str = "num_replicas is 0"
) -> list[Condition]:
    """Ready / Progressing / Degraded as a user reads them, from what the Deployment reports;
    `zero_reason` says why `desired` is 0."""
    if deployment is None:
        return [
            condition("Ready", False, "DeploymentMissing", "the Deployment does not exist yet", generation),
            condition("Progressing", True, "Creating", "creating the Deployment", generation),
            condition("Degraded", False, "AsExpected", "", generation),
        ]
    found = deployment.get("status", {}) or {}
    _, ready = counts(deployment)
    updated = int(found.get("updatedReplicas", 0) or 0)

    if desired == 0:
        ready_condition = condition("Ready", False, "ScaledToZero", zero_reason, generation)
    elif ready >= desired:
        ready_condition = condition(
            "Ready", True, "AllReplicasReady", f"{ready}/{desired} replicas ready", generation
        )
    elif ready > 0:
        ready_condition = condition(
            "Ready", False, "ReplicasNotReady", f"{ready}/{desired} replicas ready", generation
        )
    else:
        ready_condition = condition(
            "Ready", False, "NoReplicasReady", f"0/{desired} replicas ready", generation
        )

    if rolled_out_to(deployment, desired):
        progressing = condition(
            "Progressing", False, "RolloutComplete", f"{updated} updated, {ready} ready", generation
        )
    else:
        progressing = condition(
            "Progressing",
            True,
            "RollingOut",
            f"{updated}/{desired} updated, {ready}/{desired} ready",
            generation,
        )

    failure = failure_of(deployment)
    if failure is not None:
        degraded = condition("Degraded", True, failure[0], failure[1], generation)
    else:
        degraded = condition("Degraded", False, "AsExpected", "", generation)
    return [ready_condition, progressing, degraded]


def rolled_out_to(deployment: Manifest, desired: int) -> bool:
    """Whether the Deployment has rolled its pods to its current template: `desired` of them, all
    updated and ready, as its controller last counted for its current generation."""
    found = deployment.get("status", {}) or {}
    total, ready = counts(deployment)
    updated = int(found.get("updatedReplicas", 0) or 0)
    current_generation = deployment.get("metadata", {}).get("generation", 0)
    observed = found.get("observedGeneration", 0) or 0
    return observed >= current_generation and updated >= desired and total == desired and ready >= desired


def rolled_out(deployment: Manifest | None, desired: int, revision: str) -> bool:
    """Whether the Deployment has rolled its pods to `revision` (its template's revision label)."""
    if deployment is None:
        return False
    template_labels = (
        deployment.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {}) or {}
    )
    return template_labels.get(REVISION_LABEL) == revision and rolled_out_to(deployment, desired)


def canary_replicas(deployment: Manifest | None) -> CanaryReplicas | None:
    """What the canary's Deployment reports, for `status.rollout.canary`."""
    if deployment is None:
        return None
    replicas = int(deployment.get("spec", {}).get("replicas", 0) or 0)
    _, ready = counts(deployment)
    failure = failure_of(deployment)
    return CanaryReplicas(
        replicas=replicas, ready_replicas=ready, failure=f"{failure[0]}: {failure[1]}" if failure else ""
    )


def conditions_for_invalid_spec(message: str, *, generation: int) -> list[Condition]:
    """A spec the operator cannot turn into pods: nothing was changed, say why."""
    return [
        condition("Ready", False, "InvalidSpec", "the spec is invalid; see Degraded", generation),
        condition(
            "Progressing", False, "InvalidSpec", "nothing is rolled out for an invalid spec", generation
        ),
        condition("Degraded", True, "InvalidSpec", message, generation),
    ]


def conditions_for_refused_child(kind: str, message: str, *, generation: int) -> list[Condition]:
    """The API server refused a child built from this spec (e.g. an env item without a name)."""
    return [
        condition(
            "Ready", False, f"{kind}Refused", f"the {kind} could not be applied; see Degraded", generation
        ),
        condition("Progressing", False, f"{kind}Refused", "nothing is rolled out", generation),
        condition("Degraded", True, f"{kind}Refused", message, generation),
    ]


def stamped(old: Sequence[Condition], new: Sequence[Condition], now: datetime.datetime) -> list[Condition]:
    """`new`, with each `lastTransitionTime` kept from `old` unless that condition's status moved."""
    previous = {found.type: found for found in old}
    merged = []
    for found in new:
        before = previous.get(found.type)
        moved = before is None or before.status != found.status or before.last_transition_time is None
        at = now if moved else before.last_transition_time  # type: ignore[union-attr]
        merged.append(found.model_copy(update={"last_transition_time": at}))
    return merged


def transitions(old: Sequence[Condition], new: Sequence[Condition]) -> list[Transition]:
    """Conditions whose status or reason changed: one Kubernetes event each."""
    previous = {found.type: found for found in old}
    changed = []
    for found in new:
        before = previous.get(found.type)
        if before is None or (before.status, before.reason) != (found.status, found.reason):
            changed.append(Transition(found.type, found.status, found.reason, found.message))
    return changed


def batching_planned(revision: int, old: BatchingStatus | None) -> BatchingStatus:
    """`status.batching` for the spec's batching `revision`: the replicas' count is kept while the
    revision stays, and starts again from none when it moves."""
    if old is not None and old.revision == revision:
        return old
    return BatchingStatus(revision=revision)


def batching_applied(batching: BatchingStatus, revisions: Sequence[int]) -> BatchingStatus:
    """`status.batching` once the ready replicas have said which revision each runs."""
    applied = sum(1 for revision in revisions if revision == batching.revision)
    return batching.model_copy(
        update={"ready_replicas_applied": applied, "applied": bool(revisions) and applied == len(revisions)}
    )


def zero_reason(autoscaling: bool, routers_run: bool, last_scale_reason: str) -> str:
    """Why a deployment has no replica, and what brings one back, for the Ready condition."""
    if not autoscaling:
        return "num_replicas is 0"
    wake = (
        "a request through the router starts a replica"
        if routers_run
        else "no router runs to hold requests: raise autoscaling.min_replicas to serve"
    )
    return f"scaled to zero ({last_scale_reason or 'min_replicas is 0'}); {wake}"


def stamp(now: datetime.datetime) -> datetime.datetime:
    """A moment as the status keeps it: UTC, to the second."""
    return now.astimezone(datetime.UTC).replace(microsecond=0)
