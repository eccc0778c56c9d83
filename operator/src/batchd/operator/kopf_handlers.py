"""The Kopf handlers: thin triggers over `Reconciler.converge`, which does the work.

- the resource is created, resumed or changed -> converge (children and status);
- only `spec.num_replicas` changed (kubectl apply, kubectl scale, an HPA) -> patch the Deployment's
  replicas and nothing else;
- a child changes or disappears -> converge its owner: edits are undone, deletions re-created, and
  the status follows the Deployment's own;
- the resource is deleted -> nothing to do: owner references let the garbage collector remove the
  children, and no finalizer is ever added, so deletion never waits for the operator;
- every poll interval one loop reads the load of every resource's ready replicas (`scaling_loop`):
  the batching revision they run, and with `spec.autoscaling` the replica count. It learns the
  resources and their pods from the watch events below, so no poll lists anything. One loop
  rather than a Kopf daemon per resource: Kopf gives every resource with a daemon a finalizer,
  and deleting a resource should never wait for the operator.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import kopf
from prometheus_client import start_http_server

from batchd.api.kube_connection import ApiError
from batchd.api.pod import MANAGED_BY, REPLICA_APP
from batchd.api.spec import GROUP, PLURAL, VERSION
from batchd.operator.kube_requests import KubeApi
from batchd.operator.reconcile import InvalidSpec, Reconciler, owner_of
from batchd.operator.replicas import INSTANCE_LABEL, replica_pod
from batchd.operator.rollout_loop import RolloutJudge
from batchd.operator.scaling_loop import ScalingLoop
from batchd.operator.settings import Settings

# The handlers that only keep the scaling loop's picture current (see _quiet_trackers).
TRACKERS = ("Handler 'track_resource'", "Handler 'track_replica_pod'")
# Transient API failures (conflicts, throttling, a restarting API server) are retried after this.
RETRY_DELAY_S = 2.0
CHILD_RETRIES = 3


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    # Tests and embedders may hand in their own Settings; a pod reads them from its environment.
    operator_settings: Settings = memo.get("settings") or Settings.from_env()
    memo.settings = operator_settings
    settings.posting.level = logging.WARNING  # explicit transition events only, not every log line
    # Kopf lists namespaces and watches CRDs cluster-wide to follow resources as they appear; an
    # operator held to listed namespaces has no cluster-wide grant (the chart's Roles), and its
    # one CRD is installed before it starts.
    settings.scanning.disabled = bool(operator_settings.namespaces)
    logging.getLogger("kopf.objects").addFilter(_quiet_trackers)
    memo.reconciler = Reconciler(operator_settings, await KubeApi.connect(operator_settings.kubeconfig))
    session = aiohttp.ClientSession()
    memo.scaling_loop = ScalingLoop(memo.reconciler, session, judge=RolloutJudge(memo.reconciler, session))
    if operator_settings.metrics_port:
        memo.metrics_server, _thread = start_http_server(operator_settings.metrics_port)
    logger.info(f"batchd operator started: {operator_settings!r}")


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    if "scaling_loop" in memo:
        await memo.scaling_loop.close()
    if "reconciler" in memo:
        await memo.reconciler.api.close()
    if "metrics_server" in memo:
        memo.metrics_server.shutdown()
        memo.metrics_server.server_close()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.probe(id="reconciler")
def reconciler_ready(memo: kopf.Memo, **_: Any) -> bool:
    return "reconciler" in memo


async def _converge(reconciler: Reconciler, namespace: str, name: str, logger: kopf.Logger) -> None:
    try:
        await reconciler.converge(namespace, name, logger)
    except ApiError as error:
        raise kopf.TemporaryError(f"API call failed, will retry: {error}", delay=RETRY_DELAY_S) from error


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
async def reconcile(namespace: str | None, name: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    await _converge(memo.reconciler, namespace or "", name, logger)


@kopf.on.update(GROUP, VERSION, PLURAL)
async def reconcile_changes(
    namespace: str | None, name: str, diff: kopf.Diff, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    if diff and all(tuple(change[1]) == ("spec", "num_replicas") for change in diff):
        return  # a scale: `scale_deployment` patches the replicas and nothing else
    await _converge(memo.reconciler, namespace or "", name, logger)


# An update handler, not `on.field`: creation stays one handler in one cycle, so an edit that
# lands while a resource is being created is seen as an update instead of being taken as handled.
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec.num_replicas")
async def scale_deployment(
    namespace: str | None,
    name: str,
    new: Any,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    reconciler: Reconciler = memo.reconciler
    if body.spec.get("autoscaling"):
        # The autoscaler owns the count; scaling by hand (or by an HPA) would be undone at its next poll.
        kopf.warn(
            body,
            reason="AutoscalerOwnsReplicas",
            message=f"spec.num_replicas={new} is not applied while spec.autoscaling is set; "
            "change autoscaling.min_replicas/max_replicas instead",
        )
        return
    try:
        if isinstance(new, int) and await reconciler.scale(namespace or "", name, new):
            return
    except ApiError as error:
        raise kopf.TemporaryError(f"scaling failed, will retry: {error}", delay=RETRY_DELAY_S) from error
    # No Deployment yet (or a bad value): the full path.
    await _converge(reconciler, namespace or "", name, logger)


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED_BY)
@kopf.on.event("", "v1", "services", labels=MANAGED_BY)
@kopf.on.event("", "v1", "configmaps", labels=MANAGED_BY)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=MANAGED_BY)
async def child_changed(
    body: kopf.Body, type: str | None, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    owner = owner_of(body)
    if owner is None or type is None or "reconciler" not in memo:
        return  # the initial listing (type None) is covered by the resume handlers
    if memo.reconciler.is_own_echo(body, type):
        return  # our own write coming back: converge already knew what it would be
    namespace = body.metadata.namespace or ""
    for attempt in range(1, CHILD_RETRIES + 1):  # event handlers are not retried by Kopf
        try:
            await memo.reconciler.converge(namespace, owner, logger)
            return
        except InvalidSpec:
            return  # already reported on the resource
        except ApiError as error:
            logger.warning(f"converging {namespace}/{owner} failed (attempt {attempt}): {error}")
            await asyncio.sleep(RETRY_DELAY_S * attempt)


def _quiet_trackers(record: logging.LogRecord) -> bool:
    """Drop Kopf's "succeeded" line for the trackers: they run on every watch event (every pod
    change), and a line each is thousands of lines that say nothing."""
    return not (record.levelno == logging.INFO and str(record.msg).startswith(TRACKERS))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def track_resource(
    namespace: str | None, name: str, body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any
) -> None:
    memo.scaling_loop.track(namespace or "", name, None if type == "DELETED" else dict(body))
    # Started from a resource handler, not at startup: its task inherits the context in which Kopf
    # posts events (`kopf.event`), which startup handlers do not have.
    memo.scaling_loop.ensure_running()


@kopf.on.event("", "v1", "pods", labels={**MANAGED_BY, **REPLICA_APP})
async def track_replica_pod(
    namespace: str | None,
    name: str,
    labels: kopf.Labels,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    type: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    owner = (namespace or "", labels.get(INSTANCE_LABEL, ""))
    memo.scaling_loop.track_pod(
        owner, name, None if type == "DELETED" else replica_pod(name, meta, spec, status)
    )
