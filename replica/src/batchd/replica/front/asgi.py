"""The inference routes, answered in plain ASGI in front of the FastAPI app.

Every request to a batching server pays the framework's per-request cost, and with a cheap
model that cost is the throughput: FastAPI's middleware and dependency layers took about
three quarters of the time per request on the trivial handler. So the inference routes (the
endpoints of `protocols`) are found here by the route table's plain string tests and answered
directly; everything else (health, metadata, /metrics, /docs) falls through to FastAPI, where
convenience matters more than microseconds.

What every inference request goes through, whatever its protocol: read the body (bounded),
hand it to the endpoint's handler (which decodes it into items, queues them and waits for the
results, bounded by `request_timeout_s` and given up when the client disconnects), send the
answer, count the outcome (`answers`, shared with the direct path). A request that says how long
its client still waits (`batchd-timeout-s`, set by the router to the time left) is bounded by the
shorter of that and `request_timeout_s` (`batchd.replica.waiting`).
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from functools import partial
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from batchd.api.httpserver import closing
from batchd.api.routes import RouteTable
from batchd.replica.errors import ClientDisconnected, TooLarge, describe
from batchd.replica.front import answers
from batchd.replica.front.endpoints import BinaryAnswer, Call, Endpoint, EventStream
from batchd.replica.front.gate import Gate
from batchd.replica.json_encoding import json_bytes
from batchd.replica.replica import Replica

logger = logging.getLogger(__name__)


class InferenceRoutes:
    """ASGI: answers the endpoints' routes itself and hands every other request to `app`."""

    def __init__(self, app: ASGIApp, replica: Replica, endpoints: tuple[Endpoint, ...], gate: Gate) -> None:
        self.app = app
        self.replica = replica
        self.gate = gate
        self.routes = RouteTable(endpoint.route for endpoint in endpoints)
        self._endpoints = {endpoint.route.operation: endpoint for endpoint in endpoints}
        self._max_body = replica.settings.max_body_bytes
        # With a port of its own, /metrics is served there alone (`settings.metrics_port`).
        self.metrics_port = replica.settings.metrics_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.metrics_port and not self._on_its_port(scope):
            await _send_json(
                send, 404, orjson.dumps({"error": f"{scope['path']} is not served on this port"})
            )
            return
        if self.replica.batcher.draining:
            send = closing(send)  # every answer from now on tells the client to leave (see `server`)
        found = self.routes.match(scope["method"], scope["path"])
        if found is None:
            allowed = self.routes.methods_at(scope["path"])
            if allowed:  # an inference route's path, asked with another method
                await _send_not_allowed(send, scope["method"], scope["path"], allowed)
            else:
                await self.app(scope, receive, send)
            return
        route = found.route
        endpoint = self._endpoints[route.operation]
        replica = self.replica
        started = answers.opened(replica)
        tracing = replica.tracing
        trace = (
            None
            if tracing is None
            else tracing.request_started(
                route.operation, route.path, scope["method"], scope["path"], scope["headers"]
            )
        )
        stream: _StreamSender | None = None
        try:
            client = answers.client_of(self.gate, scope, partial(_disconnected, receive), trace)
            body = await _read_body(receive, self._max_body)
            call = Call(replica, found.model_name, body, scope, client)
            if endpoint.streaming is not None:
                payload: Any = endpoint.streaming.opened(call)
            else:
                assert endpoint.answer is not None
                payload = await endpoint.answer(call)
            if isinstance(payload, EventStream):
                stream = _StreamSender(payload)
                await stream.send_all(send)
            elif not isinstance(payload, BinaryAnswer):
                payload = json_bytes(payload)  # here, so a result that is no JSON is an error answer
        except Exception as error:
            answer = answers.failed(replica, error, started, trace)
            if stream is not None and stream.started:  # the status line is gone: the error is the last event
                if answer.outcome == "error":
                    logger.error("stream failed: %s", describe(error))
                await send({"type": "http.response.body", "body": stream.stream.error_event(error)})
            else:
                http, body = answers.error_answer(error, endpoint.error_body)
                await _send_json(send, http.status, body, http.headers)
            return
        except BaseException:
            answers.dropped(replica, trace)
            raise
        answers.succeeded(replica, started, trace)
        if stream is not None:
            return
        if isinstance(payload, BinaryAnswer):
            await payload.send(send)
        else:
            await _send_json(send, 200, payload)

    def _on_its_port(self, scope: Scope) -> bool:
        """Whether the request came in where its path is served: /metrics on the metrics port,
        everything else on the other."""
        server = scope.get("server")
        on_metrics_port: bool = server is not None and server[1] == self.metrics_port
        return on_metrics_port is (scope["path"] == "/metrics")


class _StreamSender:
    """Sends an EventStream: the status line goes with the first event, so that anything that
    fails before it is an ordinary error answer, and anything after it the last event."""

    __slots__ = ("started", "stream")

    def __init__(self, stream: EventStream) -> None:
        self.stream = stream
        self.started = False

    async def send_all(self, send: Send) -> None:
        async with aclosing(self.stream.events) as events:
            async for chunk in events:
                if not self.started:
                    await self._start(send)
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if not self.started:
            await self._start(send)
        await send({"type": "http.response.body", "body": b""})

    async def _start(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.stream.headers})
        self.started = True


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (the body has been read, so nothing else can arrive)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected.while_sending()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"request body: more than the {limit} bytes this replica accepts")
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


async def _send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    # With its length said, the body goes as it is (no chunked framing for either side to make or read).
    length = (b"content-length", str(len(body)).encode())
    headers = [*(headers or answers.JSON_HEADERS), length]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_not_allowed(send: Send, method: str, path: str, allowed: list[str]) -> None:
    message = f"method {method} is not allowed on {path}; it takes {', '.join(allowed)}"
    headers = [*answers.JSON_HEADERS, (b"allow", ", ".join(allowed).encode())]
    await _send_json(send, 405, orjson.dumps({"error": message}), headers)
