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
answer, count the outcome. A request that says how long its client still waits
(`batchd-timeout-s`, set by the router to the time left) is bounded by the shorter of that and
`request_timeout_s`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AbstractAsyncContextManager, aclosing, nullcontext
from functools import partial
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from batchd.api.headers import TIMEOUT_HEADER, parse_timeout_s
from batchd.api.httpserver import closing
from batchd.api.routes import RouteTable
from batchd.replica.errors import (
    ClientDisconnected,
    DeadlineExceeded,
    ErrorAnswer,
    ErrorBodyMaker,
    HttpError,
    InvalidInput,
    TooLarge,
    answer_for,
    describe,
    http_error,
)
from batchd.replica.front.endpoints import BinaryAnswer, Call, Endpoint, EventStream
from batchd.replica.replica import Replica
from batchd.replica.results import json_bytes

logger = logging.getLogger(__name__)

_JSON_HEADERS = [(b"content-type", b"application/json")]


class InferenceRoutes:
    """ASGI: answers the endpoints' routes itself and hands every other request to `app`."""

    def __init__(self, app: ASGIApp, replica: Replica, endpoints: tuple[Endpoint, ...]) -> None:
        self.app = app
        self.replica = replica
        self.routes = RouteTable(endpoint.route for endpoint in endpoints)
        self._endpoints = {endpoint.route.operation: endpoint for endpoint in endpoints}
        self._max_body = replica.settings.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.replica.batcher.draining:
            send = closing(send)  # every answer from now on tells the client to leave (see `server`)
        found = self.routes.match(scope["method"], scope["path"])
        if found is None:
            await self.app(scope, receive, send)
            return
        endpoint = self._endpoints[found.route.operation]
        replica = self.replica
        started = time.perf_counter()
        replica.inflight += 1
        stream: _StreamSender | None = None
        try:
            async with _client_deadline(scope):
                body = await _read_body(receive, self._max_body)
                call = Call(replica, found.model_name, body, scope, partial(_disconnected, receive))
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
            answer = count_failure(replica, error, started)
            if stream is not None and stream.started:  # the status line is gone: the error is the last event
                if answer.outcome == "error":
                    logger.error("stream failed: %s", describe(error))
                await send({"type": "http.response.body", "body": stream.stream.error_event(error)})
            else:
                await _send_error(send, error, endpoint)
            return
        finally:
            replica.inflight -= 1
        replica.metrics.request_done("success", time.perf_counter() - started)
        if stream is not None:
            return
        if isinstance(payload, BinaryAnswer):
            await payload.send(send)
        else:
            await _send_json(send, 200, payload)


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


def client_timeout_s(headers: list[tuple[bytes, bytes]]) -> float | None:
    """Seconds the client still waits (`batchd-timeout-s`), None when it did not say; InvalidInput
    (a 400) naming the header and the value when that is no positive number of seconds."""
    for name, value in headers:
        if name == TIMEOUT_HEADER:
            return parse_client_timeout(value)
    return None


def parse_client_timeout(value: bytes) -> float:
    """A `batchd-timeout-s` value in seconds; InvalidInput (a 400) naming the header and the value
    when it is no positive number of seconds."""
    try:
        return parse_timeout_s(value)
    except ValueError as error:
        raise InvalidInput(str(error)) from None


class _ClientDeadline:
    """Gives up on the request once the client's `batchd-timeout-s` has passed (a 504, or the last
    event of a stream); the batcher bounds it by `request_timeout_s` meanwhile, so the shorter wins.
    Cancelling the handler drops the request's items before they reach the model."""

    __slots__ = ("_timeout",)

    def __init__(self, seconds: float) -> None:
        self._timeout = asyncio.timeout(seconds)

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        try:
            await self._timeout.__aexit__(kind, error, tb)
        except TimeoutError:
            raise DeadlineExceeded.passed(TIMEOUT_HEADER.decode()) from None


def _client_deadline(scope: Scope) -> AbstractAsyncContextManager[None]:
    seconds = client_timeout_s(scope["headers"])
    return nullcontext() if seconds is None else _ClientDeadline(seconds)


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
            raise ClientDisconnected("the client went away while sending its request")
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
    await send(
        {"type": "http.response.start", "status": status, "headers": [*(headers or _JSON_HEADERS), length]}
    )
    await send({"type": "http.response.body", "body": body})


def count_failure(replica: Replica, error: BaseException, started: float) -> ErrorAnswer:
    """Counts a request that failed (its outcome, and why it was refused where it was); its table entry."""
    answer = answer_for(error)
    replica.metrics.request_done(answer.outcome, time.perf_counter() - started)
    if answer.rejection:
        replica.metrics.rejected(answer.rejection)
    return answer


def error_answer(error: BaseException, body: ErrorBodyMaker) -> tuple[HttpError, bytes]:
    """The HTTP answer for a request that failed, and its body as JSON; a failure of the model is logged."""
    if answer_for(error).outcome == "error":
        logger.error("request failed: %s", describe(error))
    answer = http_error(error, body)
    return answer, orjson.dumps(answer.body)


async def _send_error(send: Send, error: Exception, endpoint: Endpoint) -> None:
    answer, body = error_answer(error, endpoint.error_body)
    await _send_json(send, answer.status, body, answer.headers)
