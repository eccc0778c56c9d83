"""A deployment's access Secret on a real API server, converged as the operator converges it: made
with a 32-byte signing key kept across edits, its digests following the user's Secret (a key
removed, a key added), a missing Secret reported by a condition and an event naming it while the
last digests stay, and an access edit that rolls no pod; its NetworkPolicy, which the API server
takes, and which goes when the operator runs with policies off."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import kopf
import yaml
from kopf._core.engines import posting

from batchd.api.access import decode_key_digests, key_digest
from batchd.api.pod import ACCESS_KEYS_KEY, ACCESS_SIGNING_KEY
from batchd.operator.children import CONFIG_HASH_ANNOTATION
from batchd.operator.cluster import Cluster
from batchd.operator.reconcile import Reconciler
from batchd.operator.settings import Settings
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.manifests import manifest

LOGGER = logging.getLogger(__name__)


def access(classes: list[str] | None = None) -> dict[str, Any]:
    tenant: dict[str, Any] = {"name": "search", "api_keys_secret": "search-keys"}
    if classes is not None:
        tenant["priority_classes"] = classes
    return {"tenants": [tenant]}


@contextlib.contextmanager
def posted_events() -> Iterator[asyncio.Queue[posting.K8sEvent]]:
    """The events `kopf.event` posts, queued here as Kopf's poster would take them."""
    queue: asyncio.Queue[posting.K8sEvent] = asyncio.Queue()
    settings = kopf.OperatorSettings()
    settings.posting.level = logging.WARNING  # as the operator sets it: no event per log line
    tokens = (
        posting.settings_var.set(settings),
        posting.event_queue_var.set(queue),
        posting.event_queue_loop_var.set(asyncio.get_running_loop()),
    )
    try:
        yield queue
    finally:
        posting.event_queue_loop_var.reset(tokens[2])
        posting.event_queue_var.reset(tokens[1])
        posting.settings_var.reset(tokens[0])


async def converge(control_plane: ControlPlane, namespace: str, **settings: Any) -> list[posting.K8sEvent]:
    """One converge of `keyed` by an operator with these settings, as a watch event would start
    it; the events it posted."""
    cluster = await Cluster.connect(Settings(kubeconfig=str(control_plane.admin_kubeconfig), **settings))
    try:
        with posted_events() as queue:
            await Reconciler(cluster).converge(namespace, "keyed", LOGGER)
            return [queue.get_nowait() for _ in range(queue.qsize())]
    finally:
        await cluster.close()


def get(control_plane: ControlPlane, namespace: str, kind: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        control_plane.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout
    )
    return found


def apply(control_plane: ControlPlane, namespace: str, document: dict[str, Any]) -> None:
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(document))


def user_secret(control_plane: ControlPlane, namespace: str, **keys: str) -> None:
    document = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "search-keys"},
        "stringData": keys,
    }
    # Replaced whole (not merged), as a user rotating keys with `kubectl replace` does.
    control_plane.kubectl("delete", "secret", "search-keys", "-n", namespace, "--ignore-not-found")
    apply(control_plane, namespace, document)


def signing_key(control_plane: ControlPlane, namespace: str) -> bytes:
    secret = get(control_plane, namespace, "secret", "keyed-access")
    return base64.b64decode(secret["data"][ACCESS_SIGNING_KEY])


def digests(control_plane: ControlPlane, namespace: str) -> dict[str, frozenset[bytes]]:
    secret = get(control_plane, namespace, "secret", "keyed-access")
    return decode_key_digests(base64.b64decode(secret["data"][ACCESS_KEYS_KEY]))


def access_ready(control_plane: ControlPlane, namespace: str) -> dict[str, Any]:
    conditions = get(control_plane, namespace, "bd", "keyed")["status"]["conditions"]
    found: dict[str, Any] = next(c for c in conditions if c["type"] == "AccessReady")
    return found


async def test_the_access_secret_keeps_its_key_and_follows_the_users_secret(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    ns = kube_namespace
    user_secret(control_plane, ns, old="key-old", new="key-new")
    apply(control_plane, ns, manifest("keyed", access=access()))
    await converge(control_plane, ns)
    key = signing_key(control_plane, ns)
    assert len(key) == 32
    assert digests(control_plane, ns) == {"search": {key_digest("key-old"), key_digest("key-new")}}
    assert access_ready(control_plane, ns)["status"] == "True"
    secret = get(control_plane, ns, "secret", "keyed-access")
    assert secret["metadata"]["ownerReferences"][0]["name"] == "keyed"
    template = get(control_plane, ns, "deployment", "keyed")["spec"]["template"]
    hash_before = template["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]

    # An access edit: the key stays, the pods do not roll, the replicas' manifest has it.
    apply(control_plane, ns, manifest("keyed", access=access(["default"])))
    await converge(control_plane, ns)
    assert signing_key(control_plane, ns) == key
    template = get(control_plane, ns, "deployment", "keyed")["spec"]["template"]
    assert template["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == hash_before
    config = get(control_plane, ns, "configmap", "keyed-config")["data"]
    assert "search-keys" in config["manifest.yaml"] and "key-old" not in config["manifest.yaml"]

    # A key removed, a key added.
    user_secret(control_plane, ns, new="key-new", newer="key-newer")
    await converge(control_plane, ns)
    assert digests(control_plane, ns) == {"search": {key_digest("key-new"), key_digest("key-newer")}}
    assert signing_key(control_plane, ns) == key

    # The user's Secret gone: a condition and an event name it, the last digests keep serving.
    control_plane.kubectl("delete", "secret", "search-keys", "-n", ns)
    events = await converge(control_plane, ns)
    condition = access_ready(control_plane, ns)
    assert (condition["status"], condition["reason"]) == ("False", "SecretMissing")
    assert "'search-keys'" in condition["message"]
    (event,) = [event for event in events if event.reason == "SecretMissing"]
    assert event.type == "Warning" and "'search-keys'" in event.message
    assert digests(control_plane, ns) == {"search": {key_digest("key-new"), key_digest("key-newer")}}
    # Nothing of the keys in the status or the events.
    status = json.dumps(get(control_plane, ns, "bd", "keyed")["status"])
    assert "key-new" not in status and all("key-new" not in e.message for e in events)

    # Back: the condition clears.
    user_secret(control_plane, ns, newest="key-newest")
    await converge(control_plane, ns)
    assert access_ready(control_plane, ns)["status"] == "True"
    assert digests(control_plane, ns) == {"search": {key_digest("key-newest")}}
    assert signing_key(control_plane, ns) == key

    # spec.access removed: no digests, the status says the deployment is open, the replicas'
    # manifest has no access; the signing key stays (an open deployment's stamps are signed too).
    apply(control_plane, ns, manifest("keyed"))
    await converge(control_plane, ns)
    assert digests(control_plane, ns) == {}
    assert access_ready(control_plane, ns)["reason"] == "Open"
    config = get(control_plane, ns, "configmap", "keyed-config")["data"]["manifest.yaml"]
    assert "search-keys" not in config and yaml.safe_load(config)["spec"].get("access") is None
    assert signing_key(control_plane, ns) == key


async def test_the_network_policy_is_applied_and_removed_when_turned_off(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    ns = kube_namespace
    routed = {
        "router_url": "http://batchd-router.batchd-system.svc",
        "router_namespace": "batchd-system",
        "operator_namespace": "batchd-system",
        "operator_selector": "app.kubernetes.io/component=operator",
    }
    apply(control_plane, ns, manifest("keyed"))
    await converge(control_plane, ns, **routed)
    policy = get(control_plane, ns, "networkpolicy", "keyed")
    assert policy["metadata"]["ownerReferences"][0]["name"] == "keyed"
    assert [rule["ports"][0]["port"] for rule in policy["spec"]["ingress"]] == [8000, 9090]
    assert get(control_plane, ns, "serviceaccount", "keyed")["automountServiceAccountToken"] is False

    await converge(control_plane, ns, network_policy=False, **routed)
    listed = control_plane.kubectl("get", "networkpolicies", "-n", ns, "-o", "json").stdout
    assert json.loads(listed)["items"] == []
    assert get(control_plane, ns, "deployment", "keyed")  # the rest stays
