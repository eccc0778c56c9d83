"""The Kopf handlers: thin triggers over `Reconciler.converge`, which does the work.

- the resource is created, resumed or changed (`kubectl apply`, `kubectl scale`, an HPA) ->
  converge (children and status);
- a child changes or disappears -> converge its owner: edits are undone, deletions re-created, and
  the status follows the Deployment's own;
- a user's API keys Secret that some deployment's `spec.access` names changes -> converge those
  deployments (their access Secrets follow);
- the resource is deleted -> nothing to do: owner references let the garbage collector remove the
  children, and no finalizer is ever added, so deletion never waits for the operator;
- resources and replica pods as their watches see them -> the poller, whose one loop reads every
  serving replica (`poller`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
from prometheus_client import start_http_server

from batchd.api.kube_connection import ApiError
from batchd.api.pod import MANAGED_BY, REPLICA_APP, track_of
from batchd.api.spec import GROUP, PLURAL, VERSION
from batchd.operator.cluster import Cluster
from batchd.operator.poller import Poller
from batchd.operator.reconcile import InvalidSpec, Reconciler, owner_of
from batchd.operator.replicas import replica_pod
from batchd.operator.settings import Settings

# The handlers that only keep the poller's picture current (see _quiet_trackers).
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
    memo.cluster = await Cluster.connect(operator_settings)
    memo.reconciler = Reconciler(memo.cluster)
    memo.poller = Poller.of(memo.cluster, memo.reconciler)
    if operator_settings.metrics_port:
        memo.metrics_server, _thread = start_http_server(operator_settings.metrics_port)
    logger.info(f"batchd operator started: {operator_settings!r}")


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    if "poller" in memo:
        await memo.poller.close()
    if "cluster" in memo:
        await memo.cluster.close()
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
    namespace: str | None,
    name: str,
    diff: kopf.Diff,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    if body.spec.get("autoscaling") and any(tuple(change[1]) == ("spec", "num_replicas") for change in diff):
        # The autoscaler owns the count; scaling by hand (or by an HPA) is not applied.
        kopf.warn(
            body,
            reason="AutoscalerOwnsReplicas",
            message=f"spec.num_replicas={body.spec.get('num_replicas')} is not applied while "
            "spec.autoscaling is set; change autoscaling.min_replicas/max_replicas instead",
        )
    await _converge(memo.reconciler, namespace or "", name, logger)


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED_BY)
@kopf.on.event("", "v1", "services", labels=MANAGED_BY)
@kopf.on.event("", "v1", "configmaps", labels=MANAGED_BY)
@kopf.on.event("", "v1", "secrets", labels=MANAGED_BY)
@kopf.on.event("", "v1", "serviceaccounts", labels=MANAGED_BY)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=MANAGED_BY)
@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=MANAGED_BY)
async def child_changed(
    body: kopf.Body, type: str | None, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    owner = owner_of(body)
    if owner is None or type is None or "reconciler" not in memo:
        return  # the initial listing (type None) is covered by the resume handlers
    if memo.cluster.is_own_echo(body, type):
        return  # our own write coming back: converge already knew what it would be
    await _converge_with_retries(memo.reconciler, body.metadata.namespace or "", owner, logger)


def _read_by_a_deployment(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> bool:
    """Only the Secrets some deployment's access reads: every other Secret's event stops here."""
    return "cluster" in memo and bool(memo.cluster.readers_of(namespace or "", name))


@kopf.on.event("", "v1", "secrets", when=_read_by_a_deployment)
async def api_keys_changed(
    namespace: str | None, name: str, type: str | None, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """A user's API keys Secret was created, edited or deleted: the access Secrets made from it
    follow within seconds (a key added is accepted, one removed from the Secret refused), with no
    restart. A deleted one is reported missing, and its tenant's last keys kept."""
    if type is None or "reconciler" not in memo:
        return  # the initial listing: the resume handlers read every Secret anyway
    for owner in sorted(memo.cluster.readers_of(namespace or "", name)):
        await _converge_with_retries(memo.reconciler, namespace or "", owner, logger)


async def _converge_with_retries(
    reconciler: Reconciler, namespace: str, name: str, logger: kopf.Logger
) -> None:
    for attempt in range(1, CHILD_RETRIES + 1):  # event handlers are not retried by Kopf
        try:
            await reconciler.converge(namespace, name, logger)
            return
        except InvalidSpec:
            return  # already reported on the resource
        except ApiError as error:
            logger.warning(f"converging {namespace}/{name} failed (attempt {attempt}): {error}")
            await asyncio.sleep(RETRY_DELAY_S * attempt)


def _quiet_trackers(record: logging.LogRecord) -> bool:
    """Drop Kopf's "succeeded" line for the trackers: they run on every watch event (every pod
    change), and a line each is thousands of lines that say nothing."""
    return not (record.levelno == logging.INFO and str(record.msg).startswith(TRACKERS))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def track_resource(
    namespace: str | None, name: str, body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any
) -> None:
    memo.poller.track((namespace or "", name), None if type == "DELETED" else dict(body))
    # Started from a resource handler, not at startup: its task inherits the context in which Kopf
    # posts events (`kopf.event`), which startup handlers do not have.
    memo.poller.ensure_running()


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
    owner = track_of(dict(labels))
    if owner is None:
        return
    memo.poller.track_pod(
        (namespace or "", owner[0]),
        name,
        None if type == "DELETED" else replica_pod(name, meta, spec, status),
    )
