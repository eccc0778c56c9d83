"""One way through the replica for every inference request, whichever door it came in by.

A door reads a request off its transport and writes the answer back onto it: the ASGI front
(`asgi`, under uvicorn's ASGI cycle) and the direct path (`direct`, inside uvicorn's parser
callbacks). Every rule between the two is here, once, so a request gets the same answer, byte
for byte, whichever way it came in:

- `Pipeline.route` matches the method and path, once; on a metrics port of its own only
  /metrics is served, and a known path asked with another method is a 405;
- `Pipeline.open` starts the request: in flight (`Replica.inflight`, which the operator reads)
  and, where the replica traces, its span;
- `Exchange.receive` keeps the body within `max_body_bytes`;
- `Exchange.call` reads the client off the head, once: who it is as the gate believes it (the
  router's stamp), the class and caller it may claim, how long it still waits
  (`batchd-timeout-s`), and how the door learns that it has gone;
- the request enters the core once, through `Replica.submit`: by its endpoint's handler, or,
  for an endpoint of batch items (`Items`), by callback with no coroutine (`Exchange.submit`);
- every outcome is counted once, by the one error table (`errors`), and ends the span; every
  answer is a framed `Reply`: its length, and `Connection: close` while the replica drains.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from batchd.api.headers import TIMEOUT_HEADER, parse_timeout_s
from batchd.api.routes import RouteTable
from batchd.replica.errors import ErrorAnswer, InvalidInput, TooLarge, answer_for, describe, http_error
from batchd.replica.front.endpoints import BinaryAnswer, Call, Endpoint, EventStream
from batchd.replica.front.gate import ANONYMOUS, Caller, Gate
from batchd.replica.json_encoding import json_bytes
from batchd.replica.replica import Replica
from batchd.replica.traces import RequestTrace
from batchd.replica.waiting import NO_CLIENT, Abandoned, Client, Submission

logger = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]
JSON_HEADERS: Headers = [(b"content-type", b"application/json")]
CLOSE = (b"connection", b"close")
# Routes found are kept, as the same few paths come again and again; up to this many, since a
# client may name any model in a path.
ROUTES_KEPT = 256


class Reply(NamedTuple):  # a tuple: one is made per request, and a tuple is the cheapest to make
    """A whole answer, framed: its headers end with its content-length and, when the connection
    is to close after it (`closes`), `connection: close`."""

    status: int
    headers: Headers
    body: bytes
    closes: bool

    @classmethod
    def framed(cls, status: int, body: bytes, headers: Headers, closes: bool) -> Reply:
        # With its length said, the body goes as it is (no chunked framing for either side).
        framed = [*headers, (b"content-length", str(len(body)).encode())]
        if closes:
            framed.append(CLOSE)
        return cls(status, framed, body, closes)


@dataclass(frozen=True, slots=True)
class Routed:
    """A request's route: the endpoint that answers it, and the model its path names (None: none)."""

    endpoint: Endpoint
    model_name: str | None


class Pipeline:
    """The rules every inference request of one replica goes through (see the module docstring)."""

    def __init__(self, replica: Replica, endpoints: tuple[Endpoint, ...], gate: Gate) -> None:
        self.replica = replica
        self.gate = gate
        self.routes = RouteTable(endpoint.route for endpoint in endpoints)
        self._endpoints = {endpoint.route.operation: endpoint for endpoint in endpoints}
        self._routed: dict[tuple[bytes, bytes], Routed] = {}  # found by `route_raw`
        self.max_body = replica.settings.max_body_bytes
        # With a port of its own, /metrics is served there alone (`settings.metrics_port`).
        self._metrics_port = replica.settings.metrics_port

    @property
    def closes_connections(self) -> bool:
        """Whether every answer now tells its client to leave: the replica drains (see `server`)."""
        return self.replica.batcher.draining

    def route(self, method: str, path: str, port: int | None) -> Routed | Reply | None:
        """The route of `method path`, asked on `port`; a refusal where it is not served there;
        None for a request that is no inference request (health, metadata, /metrics, /docs)."""
        if self._metrics_port and (port == self._metrics_port) is not (path == "/metrics"):
            body = orjson.dumps({"error": f"{path} is not served on this port"})
            return Reply.framed(404, body, JSON_HEADERS, self.closes_connections)
        found = self.routes.match(method, path)
        if found is not None:
            return Routed(self._endpoints[found.route.operation], found.model_name)
        allowed = self.routes.methods_at(path)
        if not allowed:
            return None
        message = f"method {method} is not allowed on {path}; it takes {', '.join(allowed)}"
        headers = [*JSON_HEADERS, (b"allow", ", ".join(allowed).encode())]
        return Reply.framed(405, orjson.dumps({"error": message}), headers, self.closes_connections)

    def route_raw(self, method: bytes, path: bytes, port: int | None) -> Routed | Reply | None:
        """`route`, for a door that has the method and path as bytes (the direct path): the routes
        found are kept by them, as the same few come again and again."""
        key = (method, path)
        routed = self._routed.get(key)
        if routed is not None and port != self._metrics_port:
            return routed  # a route found is never /metrics: served on any port but that one
        found = self.route(method.decode("latin-1"), path.decode("latin-1"), port)
        if isinstance(found, Routed) and len(self._routed) < ROUTES_KEPT:
            self._routed[key] = found
        return found

    def accepts_body(self, length: int) -> bool:
        return length <= self.max_body

    def open(self, routed: Routed, method: str, target: str, headers: Headers) -> Exchange:
        """A request whose head has been read (`target`: its raw path and query) has started."""
        tracing = self.replica.tracing
        if tracing is None:
            return Exchange(self, routed, method, target, headers, None)
        route = routed.endpoint.route
        path = target.partition("?")[0]
        trace = tracing.request_started(route.operation, route.path, method, path, headers)
        return Exchange(self, routed, method, target, headers, trace)


def client_waiting(
    timeout: bytes | None, gone: Abandoned | None, caller: Caller, trace: RequestTrace | None
) -> Client:
    """A client that waits `timeout` seconds (the `batchd-timeout-s` value, None where it did not
    say), as `caller` (`gate`), its request traced by `trace`; InvalidInput (a 400) naming the
    header and the value when the timeout is no positive number."""
    if timeout is None and caller == ANONYMOUS and trace is None:
        return NO_CLIENT if gone is None else Client(gone)
    try:
        timeout_s = None if timeout is None else parse_timeout_s(timeout)
    except ValueError as error:
        raise InvalidInput(str(error)) from None
    return Client(
        gone,
        timeout_s,
        None if caller.priority is None else caller.priority.decode("latin-1"),
        "" if caller.caller is None else caller.caller.decode("latin-1"),
        tenant=caller.tenant,
        composed=caller.composed,
        trace=trace,
        queue_items=caller.queue_items,
    )


class Exchange:
    """One inference request, from the end of its head to its answer: in flight from here,
    counted once (`finished`, `succeeded`, `failed`, `dropped`)."""

    __slots__ = (
        "_answered",
        "_chunks",
        "_size",
        "endpoint",
        "headers",
        "method",
        "model_name",
        "pipeline",
        "started",
        "submission",
        "target",
        "trace",
    )

    def __init__(
        self,
        pipeline: Pipeline,
        routed: Routed,
        method: str,
        target: str,
        headers: Headers,
        trace: RequestTrace | None,
    ) -> None:
        self.pipeline = pipeline
        self.endpoint = routed.endpoint
        self.model_name = routed.model_name
        self.method = method
        self.target = target
        self.headers = headers
        self.trace = trace
        self._chunks: list[bytes] = []
        self._size = 0
        self.submission: Submission | None = None
        self._answered: Callable[[Reply], None] | None = None  # the door, until it has its answer
        pipeline.replica.inflight += 1
        self.started = time.perf_counter()

    def receive(self, chunk: bytes) -> None:
        """A piece of the body; TooLarge once the body passes `max_body_bytes`."""
        self._size += len(chunk)
        if self._size > self.pipeline.max_body:
            raise TooLarge(f"request body: more than the {self.pipeline.max_body} bytes this replica accepts")
        self._chunks.append(chunk)

    def call(self, gone: Abandoned | None) -> Call:
        """The request as its handler sees it, its client read off the head: who it is as the gate
        believes it (Unauthenticated, a 401, where it may not), how long it still waits, `gone`
        (how the door learns that it has left) and its span."""
        headers = self.headers
        caller = self.pipeline.gate.caller(self.method, self.target, headers)
        timeout = None
        for name, value in headers:
            if name == TIMEOUT_HEADER:
                timeout = value
        client = client_waiting(timeout, gone, caller, self.trace)
        body = b"".join(self._chunks)
        return Call(self.pipeline.replica, self.model_name, body, headers, self.target, client)

    async def answer(self, gone: Abandoned) -> Reply | EventStream:
        """Run the endpoint's handler: its answer framed, or the stream it opened, which the door
        sends and then counts (`succeeded`, `failed_midstream`)."""
        endpoint = self.endpoint
        try:
            call = self.call(gone)
            if endpoint.streaming is not None:
                return endpoint.streaming.opened(call)
            payload = await endpoint.whole(call)
            if isinstance(payload, EventStream):
                return payload
            return self.finished(payload)
        except Exception as error:
            return self.failed(error)
        except BaseException:
            self.dropped()
            raise

    def submit(self, answered: Callable[[Reply], None]) -> None:
        """Enter the core without a coroutine (an endpoint of batch items, `Items`): `answered`
        gets the reply once the results are in, or at once when the request fails. Raises nothing,
        so a door may call it from a callback of its parser."""
        items = self.endpoint.items
        assert items is not None
        try:
            call = self.call(None)  # the door watches the client and calls `abandon`
            self.submission = submission = call.submit(items.decode(call), items.field)
        except Exception as error:
            answered(self.failed(error))
            return
        self._answered = answered
        submission.waiter.add_done_callback(self._resolved)

    def _resolved(self, _: object) -> None:
        submission, items = self.submission, self.endpoint.items
        assert submission is not None and items is not None
        try:
            reply = self.finished(items.encode(submission.results()))
        except Exception as error:
            reply = self.failed(error)
        except BaseException:  # cancelled by neither its watch nor its client: the server stops
            self.dropped()
            raise
        finally:
            submission.close()
        # Let go of the door once it has its answer: the door holds this exchange, and a cycle
        # would be left to the garbage collector, request after request.
        answered, self._answered = self._answered, None
        assert answered is not None
        answered(reply)

    def abandon(self, why: BaseException) -> None:
        """The client has gone: what it submitted is dropped before the model (see `submit`)."""
        if self.submission is not None:
            self.submission.abandon(why)

    def finished(self, payload: Any) -> Reply:
        """The handler's answer, framed: JSON, or a V2 answer with binary data; counted a success."""
        closes = self.pipeline.closes_connections
        if isinstance(payload, BinaryAnswer):
            reply = Reply.framed(200, payload.header + payload.data, payload.headers(), closes)
        else:  # here, so that a result that is no JSON is an error answer
            reply = Reply.framed(200, json_bytes(payload), JSON_HEADERS, closes)
        self.succeeded()
        return reply

    def succeeded(self) -> None:
        """Counts a success: an answer framed (`finished`), or a stream whose last event has gone."""
        replica = self.pipeline.replica
        replica.inflight -= 1
        trace = self.trace
        if trace is None:
            replica.metrics.request_done("success", time.perf_counter() - self.started)
            return
        replica.metrics.request_done("success", time.perf_counter() - self.started, trace.exemplar)
        trace.finished(200, "success", None)

    def failed(self, error: BaseException) -> Reply:
        """The error answer, in the endpoint's error shape, from the one table; counted by its
        outcome (and why it was refused, where it was); a failure of the model is logged."""
        if self._count_failure(error).outcome == "error":
            logger.error("request failed: %s", describe(error))
        answer = http_error(error, self.endpoint.error_body)
        body = orjson.dumps(answer.body)
        return Reply.framed(answer.status, body, answer.headers, self.pipeline.closes_connections)

    def failed_midstream(self, error: BaseException, stream: EventStream) -> bytes:
        """A stream whose status line has gone failed: its last event, saying why; counted."""
        if self._count_failure(error).outcome == "error":
            logger.error("stream failed: %s", describe(error))
        return stream.error_event(error)

    def _count_failure(self, error: BaseException) -> ErrorAnswer:
        replica = self.pipeline.replica
        replica.inflight -= 1
        answer = answer_for(error)
        trace = self.trace
        elapsed = time.perf_counter() - self.started
        replica.metrics.request_done(answer.outcome, elapsed, None if trace is None else trace.exemplar)
        if answer.rejection:
            replica.metrics.rejected(answer.rejection)
        if trace is not None:
            trace.finished(answer.status, answer.outcome, error)
        return answer

    def dropped(self) -> None:
        """The server cancelled the request (its task, at shutdown): out of flight, counted nowhere."""
        self.pipeline.replica.inflight -= 1
        if self.trace is not None:
            self.trace.finished(499, "cancelled", None)
