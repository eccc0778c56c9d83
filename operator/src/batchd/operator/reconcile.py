"""Bring one BatchedDeployment's children and status in line with its spec, from the live object.

Every call starts from what the API server has now (the resource, then each child by PATCH or
POST): nothing is created "because I remember", so a restarted operator, a deleted child and an
edited child all end the same way. Calls for one resource are serialised by a lock, so two
triggers (its own watch and a child's) never race to announce the same transition twice.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from batchd.api.kube_connection import ApiError, resource_path
from batchd.api.manifest import ManifestError, parse_manifest
from batchd.api.revisions import revision_of
from batchd.api.spec import API_VERSION, PLURAL, BatchedDeployment
from batchd.operator import children, rollout, status
from batchd.operator.autoscaler import desired_replicas
from batchd.operator.kube_requests import KubeApi
from batchd.operator.metrics import (
    RECONCILE_DURATION,
    RECONCILES,
    forget,
    record_replicas,
    record_rollout_state,
)
from batchd.operator.settings import Settings

CHILD_RESOURCES = {
    "ConfigMap": ("v1", "configmaps"),
    "Deployment": ("apps/v1", "deployments"),
    "Service": ("v1", "services"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
}
# The API server refused what we sent: retrying the same spec cannot help.
REFUSED = (400, 422)


class InvalidSpec(kopf.PermanentError):
    """The spec cannot be served; the Degraded condition says why."""


@dataclass
class Reconciler:
    """What every handler shares: the settings, the API connection, one lock per resource."""

    settings: Settings
    api: KubeApi
    locks: defaultdict[tuple[str, str], asyncio.Lock] = field(
        default_factory=lambda: defaultdict(asyncio.Lock)
    )
    # (kind, namespace, name) -> the resourceVersion our own last write produced. A watch event
    # carrying exactly that version is the echo of a write `converge` already accounted for.
    own_writes: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def parent_path(self, namespace: str, name: str, subresource: str = "") -> str:
        path = resource_path(API_VERSION, PLURAL, namespace, name)
        return f"{path}/{subresource}" if subresource else path

    async def apply_child(self, manifest: dict[str, Any], namespace: str) -> dict[str, Any]:
        """Create or patch: patch the live object (the usual case), create it if it is not there."""
        applied = await self._create_or_patch(manifest, namespace)
        key = (manifest["kind"], namespace, manifest["metadata"]["name"])
        self.own_writes[key] = str(applied.get("metadata", {}).get("resourceVersion", ""))
        return applied

    async def _create_or_patch(self, manifest: dict[str, Any], namespace: str) -> dict[str, Any]:
        api_version, plural = CHILD_RESOURCES[manifest["kind"]]
        name = manifest["metadata"]["name"]
        try:
            return await self.api.merge_patch(resource_path(api_version, plural, namespace, name), manifest)
        except ApiError as error:
            if error.status != 404:
                raise
        try:
            return await self.api.create(resource_path(api_version, plural, namespace), manifest)
        except ApiError as error:
            if error.status != 409:  # created in between by someone else: patch that one
                raise
            return await self.api.merge_patch(resource_path(api_version, plural, namespace, name), manifest)

    async def delete_canary(self, namespace: str, name: str) -> None:
        """The canary's children gone (its rollout ended); those already gone are fine."""
        for kind in children.CANARY_KINDS:
            api_version, plural = CHILD_RESOURCES[kind]
            names = children.config_map_name if kind == "ConfigMap" else children.child_name
            await self.api.delete(resource_path(api_version, plural, namespace, names(name, children.CANARY)))

    def is_own_echo(self, child: Mapping[str, Any], event_type: str) -> bool:
        """True for the watch event of our own last write to this child (nothing new to act on)."""
        meta = child.get("metadata", {})
        key = (str(child.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name", "")))
        if event_type == "DELETED":
            self.own_writes.pop(key, None)
            return False
        return bool(meta.get("resourceVersion")) and self.own_writes.get(key) == meta.get("resourceVersion")

    async def scale(self, namespace: str, name: str, num_replicas: int) -> bool:
        """Patch only the Deployment's replicas; False if there is no Deployment to patch yet."""
        path = resource_path("apps/v1", "deployments", namespace, name)
        try:
            await self.api.merge_patch(path, children.replicas_patch(num_replicas))
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def converge(self, namespace: str, name: str, logger: logging.Logger | kopf.Logger) -> str | None:
        """Reconcile one resource; returns the outcome, or None if the resource is gone.

        Raises `InvalidSpec` when the spec cannot be served (after saying so in the status).
        """
        async with self.locks[(namespace, name)]:
            started = time.monotonic()
            try:
                outcome, message = await self._converge(namespace, name)
            except Exception:
                RECONCILES.labels(outcome="error").inc()
                raise
            finally:
                RECONCILE_DURATION.observe(time.monotonic() - started)
            if outcome is not None:
                RECONCILES.labels(outcome=outcome).inc()
            if outcome in ("invalid", "refused"):
                logger.warning(message)
                raise InvalidSpec(message)
            return outcome

    async def _converge(self, namespace: str, name: str) -> tuple[str | None, str]:
        body = await self.api.get(self.parent_path(namespace, name))
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            forget(namespace, name)
            return None, ""  # deleted: the owner references take the children away
        generation = int(body["metadata"].get("generation", 1))
        document = {key: body.get(key) for key in ("apiVersion", "kind", "metadata", "spec")}
        deployment: dict[str, Any] | None = None
        bd: BatchedDeployment | None = None
        desired, batching = 0, {}
        now = datetime.datetime.now(datetime.UTC)
        old_status = body.get("status") or {}
        before = rollout.Rollout.from_status(old_status)
        after = before
        try:
            bd = parse_manifest(document, origin=f"{namespace}/{name}")
        except ManifestError as error:
            outcome, message = "invalid", str(error)
            conditions = status.conditions_for_invalid_spec(message, generation=generation)
        else:
            desired = desired_replicas(bd, old_status.get("desired_replicas"))
            batching = status.batching_revision(
                bd.spec.batching.model_dump(mode="json"), generation, old_status
            )
            after = rollout.plan(
                bd, self.revision(bd), self.revision(rollout.stable_of(bd, before)), before, now
            )
            # While promoting, the stable Deployment rolls to the spec's revision.
            stable = bd if after.phase == rollout.PROMOTING else rollout.stable_of(bd, after)
            manifests = children.children(stable, self.settings, desired, batching["revision"])
            if after.phase in rollout.WITH_CANARY:
                replicas = rollout.canary_replicas(after, desired)
                manifests += children.canary_children(bd, self.settings, replicas, batching["revision"])
            kopf.adopt(manifests, owner=kopf.Body(cast(kopf.RawBody, body)))
            try:
                for manifest in manifests:
                    applied = await self.apply_child(manifest, namespace)
                    if manifest["kind"] == "Deployment" and manifest["metadata"]["name"] == name:
                        deployment = applied  # the stable one: the canary's has its own status
            except ApiError as error:
                if error.status not in REFUSED:
                    raise
                outcome, message = (
                    "refused",
                    f"the API server refused the {manifest['kind']}: {error.message}",
                )
                conditions = status.conditions_for_refused_child(
                    manifest["kind"], message, generation=generation
                )
            else:
                outcome, message = "success", ""
                if after.phase == rollout.PROMOTING and status.rolled_out(
                    deployment, desired, self.revision(bd)
                ):
                    after = rollout.promoted(bd, after)
                if before.phase in rollout.WITH_CANARY and after.phase not in rollout.WITH_CANARY:
                    await self.delete_canary(namespace, name)
                last_reason = str((old_status.get("autoscaling") or {}).get("last_scale_reason") or "")
                conditions = status.conditions_from_deployment(
                    deployment,
                    desired=desired,
                    generation=generation,
                    zero_reason=status.zero_reason(
                        bd.spec.autoscaling is not None, self.settings.routers_run, last_reason
                    ),
                )
                if bd.spec.rollout.strategy == "canary" or after.phase != rollout.NONE:
                    conditions = rollout.conditions(conditions, after, generation)

        new_status = status.build_status(
            old=old_status,
            conditions=conditions,
            generation=generation,
            deployment=deployment,
            selector=children.selector_string(name),
            url=children.service_url(bd, namespace, self.settings) if bd else "",
            model=(bd.spec.model.source or bd.spec.model.handler or "") if bd else "",
            now=now,
            revision=self.revision(rollout.stable_of(bd, after)) if bd else "",
            desired_replicas=desired if bd else None,
            batching=batching if bd else None,
            rollout=after.to_status() if bd else None,
        )
        if bd is not None:
            record_replicas(namespace, name, desired, int(new_status.get("ready_replicas") or 0))
            record_rollout_state(
                namespace, name, after.phase, after.canary_percent, after.phase in rollout.JUDGED
            )
        if new_status != old_status:
            await self.api.merge_patch(self.parent_path(namespace, name, "status"), {"status": new_status})
        for change in status.transitions(old_status.get("conditions", []), new_status["conditions"]):
            kopf.event(
                cast(kopf.Body, body),
                type="Warning" if change.warning else "Normal",
                reason=change.reason,
                message=f"{change.type}={change.status}: {change.message}".rstrip(": "),
            )
        announce_rollout(body, before, after)
        return outcome, message

    def revision(self, bd: BatchedDeployment) -> str:
        """The revision `bd`'s replicas serve: its model, run from its image (or the default)."""
        return revision_of(bd.spec, children.replica_image(bd, self.settings))


def announce_rollout(body: Mapping[str, Any], before: rollout.Rollout, after: rollout.Rollout) -> None:
    """An event for a rollout that moved (a step, a phase); nothing when it did not."""
    change = rollout.announcement(before, after)
    if change is not None:
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
