"""The router's tests: the project's emulated API server (`batchd.testing.apiserver`, which filters
by label and serves EndpointSlices), the router as a real process (`batchd.testing.servers`), and
fake replicas that answer as a test needs.
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
from typing import Any, TypeVar

import pytest

from batchd.api.spec import GROUP, PLURAL, VERSION
from batchd.bench.kit.asgi import read_body
from batchd.testing.apiserver import ApiServer, selects
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import api_server, call, eventually
from batchd.testing.servers import ServerProcess, start_router, uvicorn_in_thread

T = TypeVar("T")

SLICES_PATH = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
DEPLOYMENTS_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}"
# The labels the operator gives a replica Service (operator/children.py), which the EndpointSlice
# controller copies onto the Service's slices.
SERVICE_LABELS = {
    "app.kubernetes.io/name": "batchd-replica",
    "app.kubernetes.io/component": "replica",
    "app.kubernetes.io/managed-by": "batchd",
}


def endpoint_slice(
    service: str,
    replicas: list[str],
    *,
    name: str | None = None,
    ready: bool = True,
    namespace: str = "default",
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
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": int(ports.pop()) if ports else 8000, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [replica.rpartition(":")[0]], "conditions": {"ready": ready}}
            for replica in replicas
        ],
    }


class StandIn:
    """What the tests do to the cluster (BatchedDeployments and EndpointSlices, through the API),
    and the helpers they share: the one fixture of the router's tests."""

    slice = staticmethod(endpoint_slice)
    selects = staticmethod(selects)

    eventually = staticmethod(eventually)

    def __init__(self, server: ApiServer, tmp_path: Path) -> None:
        self.server = server
        self.tmp_path = tmp_path

    @asynccontextmanager
    async def router(self, **settings: Any) -> AsyncIterator[ServerProcess]:
        """`batchd-router` against the emulator (`settings`: RouterSettings fields), yielded once it
        has listed the deployments and endpoints; stopped on the way out."""
        router = start_router(self.server.kubeconfig_path, self.tmp_path / "logs", settings=settings)
        try:
            await asyncio.to_thread(router.wait_ready, 60)
            yield router
        finally:
            await asyncio.to_thread(router.stop, 20)

    async def _call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        return await call(self.server, method, path, body, content_type)

    async def create_deployment(
        self, name: str, *, model: str | None = None, namespace: str = "default"
    ) -> None:
        document = manifest(name)
        if model is not None:
            document["spec"]["model"]["name"] = model
        await self._call("POST", DEPLOYMENTS_PATH.format(ns=namespace), document)

    async def deploy(self, name: str, *replicas: str) -> None:
        """A BatchedDeployment `name` whose Service has these ready replicas (`host:port`), each in
        a slice of its own (a slice has one port)."""
        await self.create_deployment(name)
        for n, replica in enumerate(replicas):
            await self.put_slice(endpoint_slice(name, [replica], name=f"{name}-{n}"))

    async def delete_deployment(self, name: str, namespace: str = "default") -> None:
        await self._call("DELETE", f"{DEPLOYMENTS_PATH.format(ns=namespace)}/{name}")

    async def put_slice(self, document: dict[str, Any]) -> None:
        namespace, name = document["metadata"]["namespace"], document["metadata"]["name"]
        if self.server.get_object("discovery.k8s.io/endpointslices", namespace, name) is None:
            await self._call("POST", SLICES_PATH.format(ns=namespace), document)
        else:
            path = f"{SLICES_PATH.format(ns=namespace)}/{name}"
            await self._call("PATCH", path, document, "application/merge-patch+json")

    async def delete_slice(self, name: str, namespace: str = "default") -> None:
        await self._call("DELETE", f"{SLICES_PATH.format(ns=namespace)}/{name}")


@pytest.fixture
async def stand_in(tmp_path: Path) -> AsyncIterator[StandIn]:
    async with api_server(tmp_path) as server:
        yield StandIn(server, tmp_path)


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

    def __init__(self) -> None:
        self.received = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
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
def fakes() -> Iterator[Callable[[str], FakeReplica]]:
    """`fakes(mode)`: a FakeReplica listening on loopback; all stopped after the test."""
    with contextlib.ExitStack() as stack:

        def start(mode: str) -> FakeReplica:
            fake = FakeReplica(mode)
            fake.url = stack.enter_context(uvicorn_in_thread(fake, wait_ready=False))
            return fake

        yield start


@pytest.fixture
def resetting() -> Iterator[ResettingReplica]:
    replica = ResettingReplica()
    yield replica
    replica.close()
