"""A router on a real API server with no node: two namespaces, the router's ServiceAccount bound to
its Role in each (as the chart makes them for `watchNamespaces`), BatchedDeployments with no
operator, and the EndpointSlices the caller writes itself, as an EndpointSlice controller would,
so that it says which replica is ready when. The router's tests and its benchmark use it.

The API server refuses loopback addresses in a slice, so every replica listens on the cluster's own
address (`RouterNamespaces.host`, on this machine's loopback device).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from batchd.api.access import encode_key_digests, key_digest
from batchd.api.pod import (
    ACCESS_COMPONENT,
    ACCESS_KEYS_KEY,
    ACCESS_SIGNING_KEY,
    INSTANCE_LABEL,
    INVOKE_VERB,
    MANAGED_BY,
    SERVICE_NAME_LABEL,
    TOKEN_AUDIENCE,
    labels,
)
from batchd.api.spec import GROUP, PLURAL, VERSION
from batchd.router.rbac import AUTH_DELEGATOR, role
from batchd.testing.kubernetes.components import call
from batchd.testing.kubernetes.controlplane import ControlPlane, unique_name
from batchd.testing.kubernetes.controlplane import kubeconfig as kubeconfig_document
from batchd.testing.kubernetes.logs import ComponentLogs, watched
from batchd.testing.manifests import manifest
from batchd.testing.servers import ServerProcess, start_router
from batchd.testing.waiting import eventually_async

SLICES_PATH = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
DEPLOYMENTS_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}"
ROUTER_ACCOUNT = "batchd-router"
# A slice's manager other than the real EndpointSlice controller's, which then leaves it alone.
SLICE_MANAGER = "batchd-tests"
RBAC_GROUP = "rbac.authorization.k8s.io"
SIGNING_KEY = b"k" * 32  # the signing key of every access Secret written here


def access_secret(name: str, namespace: str, keys: dict[str, list[str]]) -> dict[str, Any]:
    """Deployment `name`'s access Secret as the operator keeps it: the signing key and the digests
    of each tenant's API keys (`keys`: tenant -> its keys)."""
    digests = encode_key_digests({tenant: [key_digest(k) for k in found] for tenant, found in keys.items()})
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"{name}-access",
            "namespace": namespace,
            "labels": {**ACCESS_COMPONENT, **MANAGED_BY, INSTANCE_LABEL: name},
        },
        "data": {
            ACCESS_SIGNING_KEY: base64.b64encode(SIGNING_KEY).decode(),
            ACCESS_KEYS_KEY: base64.b64encode(digests).decode(),
        },
    }


def endpoint_slice(
    service: str, replicas: list[str], *, namespace: str, name: str | None = None, ready: bool = True
) -> dict[str, Any]:
    """An EndpointSlice as the controller makes it for a replica Service: `replicas` are `host:port`
    (a slice has one port, so replicas on other ports go in other slices)."""
    ports = {replica.rpartition(":")[2] for replica in replicas}
    assert len(ports) <= 1, f"one port per slice: {replicas}"
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name or f"{service}-slice",
            "namespace": namespace,
            # The labels the operator gives a replica Service, which the EndpointSlice controller
            # copies onto the Service's slices.
            "labels": {
                **labels(service),
                SERVICE_NAME_LABEL: service,
                "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER,
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": int(ports.pop()) if ports else 8000, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [replica.rpartition(":")[0]], "conditions": {"ready": ready}}
            for replica in replicas
        ],
    }


def _checked(response: httpx.Response) -> dict[str, Any]:
    document: dict[str, Any] = response.json()
    assert response.is_success, document
    return document


class RouterNamespaces:
    """Two namespaces of the real API server for one test, what the test does in them
    (BatchedDeployments and EndpointSlices), and the router that watches them: the one fixture of
    the router's tests. `namespace` is where a call goes unless it names another."""

    eventually = staticmethod(eventually_async)

    def __init__(self, control_plane: ControlPlane, tmp_path: Path) -> None:
        self.control_plane = control_plane
        self.tmp_path = tmp_path
        self.api = control_plane.client()
        self.namespace, self.second_namespace = unique_name("r"), unique_name("r2")
        self.router_user = f"system:serviceaccount:{self.namespace}:{ROUTER_ACCOUNT}"

    @property
    def host(self) -> str:
        """The address a replica listens on, for the router to reach it through a slice."""
        return self.control_plane.addresses.api

    def set_up(self) -> None:
        """The namespaces, and the router's ServiceAccount bound to its Role in each, as the chart
        makes them for `watchNamespaces`."""
        for namespace in (self.namespace, self.second_namespace):
            self._post("/api/v1/namespaces", {"metadata": {"name": namespace}})
            self._post(
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
                role(ROUTER_ACCOUNT, namespace),
            )
            binding = {
                "metadata": {"name": ROUTER_ACCOUNT},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROUTER_ACCOUNT},
                "subjects": [{"kind": "ServiceAccount", "name": ROUTER_ACCOUNT, "namespace": self.namespace}],
            }
            self._post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", binding)
        self._post(
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts", {"metadata": {"name": ROUTER_ACCOUNT}}
        )

    def tear_down(self) -> None:
        """Delete the namespaces, without waiting: their names are never used again."""
        for namespace in (self.namespace, self.second_namespace):
            self.api.delete(f"/api/v1/namespaces/{namespace}")
        self.api.close()

    def _post(self, path: str, document: dict[str, Any]) -> dict[str, Any]:
        return _checked(self.api.post(path, json=document))

    def _kubeconfig(self) -> Path:
        """The router's ServiceAccount token (TokenRequest), as its pod would have it projected."""
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{ROUTER_ACCOUNT}/token"
        token = self._post(path, {"spec": {"expirationSeconds": 3600}})["status"]["token"]
        kubeconfig = self.tmp_path / "router.kubeconfig"
        server, ca = self.control_plane.server, self.control_plane.ca.cert
        kubeconfig.write_text(yaml.safe_dump(kubeconfig_document(server, ca, user={"token": token})))
        return kubeconfig

    @asynccontextmanager
    async def router(
        self, env: dict[str, str] | None = None, **settings: Any
    ) -> AsyncIterator[ServerProcess]:
        """`batchd-router` watching this test's namespaces (`settings`: RouterSettings fields; `env`:
        other variables), yielded once it has listed the deployments and endpoints; stopped on the
        way out."""
        settings = {"namespaces": f"{self.namespace},{self.second_namespace}", **settings}
        router = start_router(self._kubeconfig(), self.tmp_path / "logs", settings=settings, env=env)
        with watched(ComponentLogs(None, files=[router.log_path])):
            try:
                await asyncio.to_thread(router.wait_ready, 60)
                yield router
            finally:
                await asyncio.to_thread(router.stop, 20)

    def grant_token_reviews(self) -> None:
        """Let the router review tokens, as the chart does: its ServiceAccount bound to Kubernetes'
        own `system:auth-delegator` (TokenReview and SubjectAccessReview)."""
        binding = {
            "metadata": {"name": f"{self.namespace}-{ROUTER_ACCOUNT}-reviews"},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": AUTH_DELEGATOR},
            "subjects": [{"kind": "ServiceAccount", "name": ROUTER_ACCOUNT, "namespace": self.namespace}],
        }
        self._post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)

    def invoker_token(self, account: str, *, seconds: int = 3600) -> str:
        """A token of a new ServiceAccount `account` in this namespace, with batchd's audience (as a
        pod's projected token would be), that RBAC lets `invoke` this namespace's deployments."""
        namespace = self.namespace
        self._post(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": account}})
        rules = [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": [INVOKE_VERB]}]
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
        self._post(f"{rbac}/roles", {"metadata": {"name": account}, "rules": rules})
        binding = {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        }
        self._post(f"{rbac}/rolebindings", binding)
        request = {"spec": {"audiences": [TOKEN_AUDIENCE], "expirationSeconds": seconds}}
        issued = self._post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", request)
        return str(issued["status"]["token"])

    def put_access_secret(self, deployment: str, keys: dict[str, list[str]]) -> None:
        """`deployment`'s access Secret (`access_secret`), as the operator would write it."""
        secret = access_secret(deployment, self.namespace, keys)
        self._post(f"/api/v1/namespaces/{self.namespace}/secrets", secret)

    def router_calls(self) -> set[tuple[str, str, str]]:
        """(API group, resource, verb) of every request the router made, as the API server's audit
        log recorded them; each one it was refused fails the test."""
        events = self.control_plane.audit_events(self.router_user)
        refused = [event for event in events if event["responseStatus"]["code"] >= 400]
        assert not refused, refused
        return {call(event) for event in events}

    def slice(
        self,
        service: str,
        replicas: list[str],
        *,
        name: str | None = None,
        ready: bool = True,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        return endpoint_slice(
            service, replicas, name=name, ready=ready, namespace=namespace or self.namespace
        )

    async def create_deployment(
        self,
        name: str,
        *,
        model: str | None = None,
        namespace: str | None = None,
        serves: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        """A BatchedDeployment (`fields`: `manifest`'s keyword arguments; `serves`: its whole model
        block, `model` its name), with no operator: what the router reads is the resource, and the
        slices the test writes."""
        document = manifest(name, serves, **fields) if serves is not None else manifest(name, **fields)
        if model is not None:
            document["spec"]["model"]["name"] = model
        self._post(DEPLOYMENTS_PATH.format(ns=namespace or self.namespace), document)

    async def deploy(self, name: str, *replicas: str, **fields: Any) -> None:
        """A BatchedDeployment `name` (`fields`: `manifest`'s keyword arguments) whose Service has
        these ready replicas (`host:port`), each in a slice of its own (a slice has one port)."""
        await self.create_deployment(name, **fields)
        for n, replica in enumerate(replicas):
            await self.put_slice(self.slice(name, [replica], name=f"{name}-{n}"))

    async def delete_deployment(self, name: str, namespace: str | None = None) -> None:
        _checked(self.api.delete(f"{DEPLOYMENTS_PATH.format(ns=namespace or self.namespace)}/{name}"))

    async def put_slice(self, document: dict[str, Any]) -> None:
        """Create the slice, or replace the one of that name (as the controller updates it)."""
        namespace, name = document["metadata"]["namespace"], document["metadata"]["name"]
        path = f"{SLICES_PATH.format(ns=namespace)}/{name}"
        if self.api.get(path).status_code == 404:
            self._post(SLICES_PATH.format(ns=namespace), document)
        else:
            _checked(
                self.api.patch(path, json=document, headers={"Content-Type": "application/merge-patch+json"})
            )

    async def delete_slice(self, name: str, namespace: str | None = None) -> None:
        _checked(self.api.delete(f"{SLICES_PATH.format(ns=namespace or self.namespace)}/{name}"))

    async def __aenter__(self) -> RouterNamespaces:
        await asyncio.to_thread(self.set_up)
        return self

    async def __aexit__(self, *_: object) -> None:
        await asyncio.to_thread(self.tear_down)
