"""The router's tests: a real Kubernetes API server with no node behind it, where the test writes
the EndpointSlices (`batchd.testing.kubernetes.routed`), the router as a real process on a
ServiceAccount that holds exactly the router's Role, and fake replicas that answer as a test needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from batchd.testing.asgi import read_body
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.routed import RouterNamespaces
from batchd.testing.servers import ServerProcess, uvicorn_in_thread


class Routed(RouterNamespaces):
    """`RouterNamespaces` that keeps its running router's admin URL (`/metrics`, `/held`)."""

    admin_url = ""

    @contextlib.asynccontextmanager
    async def router(
        self, env: dict[str, str] | None = None, **settings: Any
    ) -> AsyncIterator[ServerProcess]:
        async with super().router(env, **settings) as router:
            self.admin_url = router.admin_url
            yield router


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
def fakes(cluster: RouterNamespaces) -> Iterator[Callable[[str], FakeReplica]]:
    """`fakes(mode)`: a FakeReplica listening on the cluster's address; all stopped after the test."""
    with contextlib.ExitStack() as stack:

        def start(mode: str) -> FakeReplica:
            fake = FakeReplica(mode)
            fake.url = stack.enter_context(uvicorn_in_thread(fake, wait_ready=False, host=cluster.host))
            return fake

        yield start


@pytest.fixture
def resetting(cluster: RouterNamespaces) -> Iterator[ResettingReplica]:
    replica = ResettingReplica(cluster.host)
    yield replica
    replica.close()
