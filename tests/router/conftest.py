"""The router's tests: a real Kubernetes API server (`batchd.testing.kubernetes`) with no node
behind it, the router as a real process (`batchd.testing.servers`) on a ServiceAccount that holds
exactly the router's Role, and fake replicas that answer as a test needs.

The test writes the EndpointSlices itself, as an EndpointSlice controller would, so that it says
which replica is ready when. The API server refuses loopback addresses in a slice, so every replica
listens on the cluster's own address (`Routed.host`, on this machine's loopback device).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from batchd.api.spec import GROUP, PLURAL, VERSION
from batchd.bench.kit.asgi import read_body
from batchd.router.rbac import role
from batchd.testing.kubernetes.controlplane import ControlPlane, unique_name
from batchd.testing.kubernetes.controlplane import kubeconfig as kubeconfig_document
from batchd.testing.manifests import manifest
from batchd.testing.servers import ServerProcess, start_router, uvicorn_in_thread
from batchd.testing.waiting import eventually_async

SLICES_PATH = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
DEPLOYMENTS_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}"
ROUTER_ACCOUNT = "batchd-router"
# The labels the operator gives a replica Service (operator/children.py), which the EndpointSlice
# controller copies onto the Service's slices.
SERVICE_LABELS = {
    "app.kubernetes.io/name": "batchd-replica",
    "app.kubernetes.io/component": "replica",
    "app.kubernetes.io/managed-by": "batchd",
}
# A slice's manager other than the real EndpointSlice controller's, which then leaves it alone.
SLICE_MANAGER = "batchd-tests"


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
            "labels": {
                **SERVICE_LABELS,
                "app.kubernetes.io/instance": service,
                "kubernetes.io/service-name": service,
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


class Routed:
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
    async def router(self, **settings: Any) -> AsyncIterator[ServerProcess]:
        """`batchd-router` watching this test's namespaces (`settings`: RouterSettings fields),
        yielded once it has listed the deployments and endpoints; stopped on the way out."""
        settings = {"namespaces": f"{self.namespace},{self.second_namespace}", **settings}
        router = start_router(self._kubeconfig(), self.tmp_path / "logs", settings=settings)
        try:
            await asyncio.to_thread(router.wait_ready, 60)
            yield router
        finally:
            await asyncio.to_thread(router.stop, 20)

    def router_calls(self) -> set[tuple[str, str, str]]:
        """(API group, resource, verb) of every request the router made, as the API server's audit
        log recorded them; each one it was refused fails the test."""
        events = self.control_plane.audit_events(self.router_user)
        refused = [event for event in events if event["responseStatus"]["code"] >= 400]
        assert not refused, refused
        return {
            (event["objectRef"].get("apiGroup", ""), event["objectRef"]["resource"], event["verb"])
            for event in events
        }

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
        self, name: str, *, model: str | None = None, namespace: str | None = None, **fields: Any
    ) -> None:
        """A BatchedDeployment (`fields`: `manifest`'s keyword arguments), with no operator: what
        the router reads is the resource, and the slices the test writes."""
        document = manifest(name, **fields)
        if model is not None:
            document["spec"]["model"]["name"] = model
        self._post(DEPLOYMENTS_PATH.format(ns=namespace or self.namespace), document)

    async def deploy(self, name: str, *replicas: str) -> None:
        """A BatchedDeployment `name` whose Service has these ready replicas (`host:port`), each in
        a slice of its own (a slice has one port)."""
        await self.create_deployment(name)
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


@pytest.fixture
def cluster(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Routed]:
    routed = Routed(control_plane, tmp_path)
    routed.set_up()
    try:
        yield routed
    finally:
        routed.tear_down()


class FakeReplica:
    """A replica's HTTP surface and nothing behind it, over real uvicorn: it counts what it was sent
    and answers as `mode` says. `ok`: 200; `refuse`: 503 marked as refused before accepting;
    `overloaded`: 503 unmarked (a callee's refusal after accepting); `echo`: the body back;
    `hang`: no answer until its client leaves; `closing`: 200 with `Connection: close`;
    `stream`: Server-Sent Events,
    the second one only once `go_on` is set."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.received = 0
        self.bodies: list[bytes] = []
        self.headers: list[dict[bytes, bytes]] = []
        self.left = 0  # clients seen leaving (`hang`)
        self.go_on = threading.Event()
        self.url = ""
        self.load = {"ready": True, "queued_items": 0, "running_items": 0}  # what GET /load says

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if scope["path"] == "/load":
            await _answer(send, 200, json.dumps(self.load).encode())
            return
        self.received += 1
        self.bodies.append(body)
        self.headers.append(dict(scope["headers"]))
        if self.mode == "refuse":
            headers = [(b"retry-after", b"1"), (b"batchd-refused", b"queue_full")]
            await _answer(send, 503, b'{"error": "queue full"}', headers)
        elif self.mode == "overloaded":
            await _answer(send, 503, b'{"error": "callee overloaded"}', [(b"retry-after", b"1")])
        elif self.mode == "hang":  # computes until its client leaves
            if (await receive())["type"] == "http.disconnect":
                self.left += 1
        elif self.mode == "closing":  # as a draining replica answers: and then it closes
            await _answer(send, 200, b'{"predictions": [2]}', [(b"connection", b"close")])
        elif self.mode == "echo":
            await _answer(send, 200, body, [(b"content-type", b"application/octet-stream")])
        elif self.mode == "stream":
            headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            first = b'data: {"text_output": "one"}\n\n'
            await send({"type": "http.response.body", "body": first, "more_body": True})
            await asyncio.to_thread(self.go_on.wait, 30)
            await send({"type": "http.response.body", "body": b'data: {"text_output": "two"}\n\n'})
        else:
            await _answer(send, 200, b'{"predictions": [' + str(self.url.rpartition(":")[2]).encode() + b"]}")


async def _answer(
    send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", b"application/json"), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ResettingReplica:
    """A replica that reads the whole request and then drops the connection without answering:
    what a crash after accepting looks like from outside. Counts the requests it read."""

    def __init__(self, host: str) -> None:
        self.received = 0
        self._listener = socket.create_server((host, 0))
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            with connection:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = connection.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                if b"/load" in data.split(b"\r\n", 1)[0]:
                    continue
                self.received += 1
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() below, which close() would not
        self._listener.close()
        self._thread.join(timeout=5)


@pytest.fixture
def fakes(cluster: Routed) -> Iterator[Callable[[str], FakeReplica]]:
    """`fakes(mode)`: a FakeReplica listening on the cluster's address; all stopped after the test."""
    with contextlib.ExitStack() as stack:

        def start(mode: str) -> FakeReplica:
            fake = FakeReplica(mode)
            fake.url = stack.enter_context(uvicorn_in_thread(fake, wait_ready=False, host=cluster.host))
            return fake

        yield start


@pytest.fixture
def resetting(cluster: Routed) -> Iterator[ResettingReplica]:
    replica = ResettingReplica(cluster.host)
    yield replica
    replica.close()
