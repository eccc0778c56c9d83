"""The status of a BatchedDeployment, derived from its Deployment's status by pure functions.

Conditions follow the Kubernetes API conventions: `type`, `status` ("True"/"False"/"Unknown"),
a CamelCase `reason`, a human `message`, and a `lastTransitionTime` that moves only when the
status does. `transitions()` tells the handlers which changes deserve a Kubernetes event.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from batchd.api.revisions import REVISION_LABEL

Status = dict[str, Any]
Condition = dict[str, Any]


@dataclass(frozen=True)
class Transition:
    """A condition that changed: what the event says."""

    type: str
    status: str
    reason: str
    message: str

    @property
    def warning(self) -> bool:
        return (self.type in ("Degraded", "RolledBack") and self.status == "True") or (
            self.type == "Ready" and self.status == "False" and self.reason != "ScaledToZero"
        )


def condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> Condition:
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def _deploymentcondition(deployment: dict[str, Any], type_: str) -> dict[str, Any]:
    for condition in deployment.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == type_:
            return dict(condition)
    return {}


def conditions_from_deployment(
    deployment: dict[str, Any] | None,
    *,
    desired: int,
    generation: int,
    zero_reason: str = "num_replicas is 0",
) -> list[Condition]:
    """Ready / Progressing / Degraded as a user reads them, from what the Deployment reports;
    `zero_reason` says why `desired` is 0."""
    if deployment is None:
        return [
            condition("Ready", False, "DeploymentMissing", "the Deployment does not exist yet", generation),
            condition("Progressing", True, "Creating", "creating the Deployment", generation),
            condition("Degraded", False, "AsExpected", "", generation),
        ]
    status = deployment.get("status", {}) or {}
    ready = int(status.get("readyReplicas", 0) or 0)
    updated = int(status.get("updatedReplicas", 0) or 0)
    rolled_out = rolled_out_to(deployment, desired)

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

    if rolled_out:
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

    stuck = _deploymentcondition(deployment, "Progressing")
    failure = _deploymentcondition(deployment, "ReplicaFailure")
    if stuck.get("reason") == "ProgressDeadlineExceeded":
        degraded = condition(
            "Degraded",
            True,
            "ProgressDeadlineExceeded",
            stuck.get("message", "the rollout is stuck"),
            generation,
        )
    elif failure.get("status") == "True":
        degraded = condition(
            "Degraded",
            True,
            failure.get("reason") or "ReplicaFailure",
            failure.get("message", ""),
            generation,
        )
    else:
        degraded = condition("Degraded", False, "AsExpected", "", generation)
    return [ready_condition, progressing, degraded]


def rolled_out_to(deployment: dict[str, Any], desired: int) -> bool:
    """Whether the Deployment has rolled its pods to its current template: `desired` of them, all
    updated and ready, as its controller last counted for its current generation."""
    status = deployment.get("status", {}) or {}
    ready = int(status.get("readyReplicas", 0) or 0)
    updated = int(status.get("updatedReplicas", 0) or 0)
    total = int(status.get("replicas", 0) or 0)
    current_generation = deployment.get("metadata", {}).get("generation", 0)
    observed = status.get("observedGeneration", 0) or 0
    return observed >= current_generation and updated >= desired and total == desired and ready >= desired


def rolled_out(deployment: dict[str, Any] | None, desired: int, revision: str) -> bool:
    """Whether the Deployment has rolled its pods to `revision` (its template's revision label)."""
    if deployment is None:
        return False
    labels = deployment.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {}) or {}
    return labels.get(REVISION_LABEL) == revision and rolled_out_to(deployment, desired)


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


def merge_conditions(old: list[Condition], new: list[Condition], now: datetime.datetime) -> list[Condition]:
    """`new`, with each `lastTransitionTime` kept from `old` unless that condition's status moved."""
    previous = {condition.get("type"): condition for condition in old or []}
    at = stamp(now)
    merged = []
    for condition in new:
        before = previous.get(condition["type"], {})
        moved = before.get("status") != condition["status"]
        merged.append(
            {**condition, "lastTransitionTime": at if moved else before.get("lastTransitionTime", at)}
        )
    return merged


def transitions(old: list[Condition], new: list[Condition]) -> list[Transition]:
    """Conditions whose status or reason changed: one Kubernetes event each."""
    previous = {condition.get("type"): condition for condition in old or []}
    changed = []
    for condition in new:
        before = previous.get(condition["type"], {})
        if (before.get("status"), before.get("reason")) != (condition["status"], condition["reason"]):
            changed.append(
                Transition(condition["type"], condition["status"], condition["reason"], condition["message"])
            )
    return changed


def batching_revision(batching: dict[str, Any], generation: int, old: Status) -> dict[str, Any]:
    """`status.batching`'s revision and hash: the revision (the resource's metadata.generation at
    the time) moves only when spec.batching does, so that replicas are told of a new batching only
    when there is one."""
    digest = hashlib.sha256(json.dumps(batching, sort_keys=True).encode()).hexdigest()[:16]
    previous = old.get("batching") or {}
    if previous.get("hash") == digest and isinstance(previous.get("revision"), int):
        return {**previous, "hash": digest}
    return {"revision": generation, "hash": digest, "ready_replicas_applied": 0, "applied": False}


def batching_applied(batching: dict[str, Any], revisions: list[int]) -> dict[str, Any]:
    """`status.batching` once the ready replicas have said which revision each runs."""
    applied = sum(1 for revision in revisions if revision == batching.get("revision"))
    return {
        **batching,
        "ready_replicas_applied": applied,
        "applied": bool(revisions) and applied == len(revisions),
    }


def stamp(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_status(
    *,
    old: Status,
    conditions: list[Condition],
    generation: int,
    deployment: dict[str, Any] | None,
    selector: str,
    url: str,
    model: str,
    now: datetime.datetime,
    revision: str = "",
    desired_replicas: int | None = None,
    batching: dict[str, Any] | None = None,
    rollout: dict[str, Any] | None = None,
) -> Status:
    """The whole status: replica counts from the Deployment, conditions with stable transition times.
    What the scaling loop wrote (`autoscaling`, and `batching` when not given) is kept."""
    deployment_status = (deployment or {}).get("status", {}) or {}
    kept = {key: old[key] for key in ("autoscaling", "batching", "desired_replicas", "rollout") if key in old}
    computed: Status = {}
    if rollout is not None:
        computed["rollout"] = rollout
    if desired_replicas is not None:
        computed["desired_replicas"] = desired_replicas
    if batching is not None:
        computed["batching"] = batching
    return (
        kept
        | computed
        | {
            "replicas": int(deployment_status.get("replicas", 0) or 0),
            "ready_replicas": int(deployment_status.get("readyReplicas", 0) or 0),
            "observed_generation": generation,
            "selector": selector,
            "url": url,
            "model": model,
            "revision": revision,
            "conditions": merge_conditions(old.get("conditions", []), conditions, now),
        }
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
