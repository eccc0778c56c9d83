"""An inference route bound to what answers it and to what the OpenAPI document says of it.

`batchd.api.routes` holds the routes as plain data; each protocol module binds its routes here
to a handler and to the schemas of its request and answer. From the bound table the pipeline
(`pipeline`) answers requests and `openapi` writes the document, so a route is declared once.

A handler takes the request as a `Call` (body read and bounded, model name from the path) and
returns the answer: a JSON-able value, a `BinaryAnswer`, an `EventStream` where the request
asked for one (OpenAI's `stream: true`), or, for a streaming route, the events as bytes; an
endpoint of batch items gives how to decode and encode them (`Items`). Errors are raised, and
answered from the table in `errors`, in the endpoint's error shape (`pipeline`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import orjson
from pydantic import BaseModel

from batchd.api.routes import Route
from batchd.replica.errors import ErrorBody, ErrorBodyMaker, InvalidInput, error_body
from batchd.replica.replica import Replica
from batchd.replica.waiting import Client, Submission, outcome


@dataclass(slots=True)  # not frozen: one is made per request, and frozen adds to its __init__
class Call:
    """One inference request, as its handler sees it."""

    replica: Replica
    model_name: str | None  # from the path; None where the path names no model
    body: bytes
    headers: list[tuple[bytes, bytes]]  # names in lower case, as both doors read them
    target: str  # the raw path and query
    client: Client  # who it is, how long it waits, and when it has gone

    def json(self) -> Any:
        """The body as JSON, or InvalidInput saying why not."""
        return parse_json(self.body)

    def query(self) -> list[tuple[str, str]]:
        return parse_qsl(self.target.partition("?")[2], keep_blank_values=True)

    def header(self, name: bytes) -> str | None:
        for key, value in self.headers:
            if key == name:
                return str(value.decode("latin-1"))
        return None

    def submit(self, items: list[Any], field: str) -> Submission:
        """Queue the items with everybody else's (`Replica.submit`), for the model the path names."""
        if self.model_name is not None:
            self.replica.check_name(self.model_name)
        return self.replica.submit(items, field, self.client)

    async def infer(self, items: list[Any], field: str) -> list[Any]:
        """`submit`, then the results in order; a client that leaves cancels what has not run."""
        return await outcome(self.submit(items, field))


def parse_json(body: bytes) -> Any:
    if not body:
        raise InvalidInput("request body: empty; expected JSON")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise InvalidInput(f"request body: not valid JSON: {error}") from None


@dataclass(frozen=True, slots=True)
class BinaryAnswer:
    """A V2 answer with binary tensor data: the JSON header, then the tensors' bytes."""

    header: bytes
    data: bytes

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [
            (b"content-type", b"application/octet-stream"),
            (b"inference-header-content-length", str(len(self.header)).encode()),
        ]


@dataclass(frozen=True, slots=True)
class EventStream:
    """An answer the request asked to have streamed: its events, the headers of its status line,
    and the last event that tells of an error after the first."""

    events: AsyncGenerator[bytes, None]
    headers: list[tuple[bytes, bytes]]
    error_event: Callable[[BaseException], bytes]


Answerer = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Items:
    """An endpoint whose request is batch items and whose answer is made of their results alone:
    `decode` takes the items out of the request (InvalidInput naming the field where it cannot),
    `encode` makes the answer of their results. Either door may answer it, the direct path with
    no coroutine per request (`pipeline.Exchange.submit`)."""

    field: str  # the request's field that holds the items, as errors name it
    decode: Callable[[Call], list[Any]]
    encode: Callable[[list[Any]], Any]

    async def answer(self, call: Call) -> Any:
        return self.encode(await call.infer(self.decode(call), self.field))


Streamer = Callable[[Call], AsyncGenerator[bytes, None]]


@dataclass(frozen=True, slots=True)
class Streaming:
    """A streamed answer: `events` yields it a piece at a time. The status line goes with the first
    piece (an empty one still sends it), so a failure before it is an ordinary error answer; a
    failure after it becomes the last piece, `error_event`."""

    events: Streamer
    headers: list[tuple[bytes, bytes]]
    error_event: Callable[[BaseException], bytes]
    media_type: str
    description: str  # of the 200 answer, for the OpenAPI document

    def opened(self, call: Call) -> EventStream:
        return EventStream(self.events(call), self.headers, self.error_event)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A route, its handler (`answer` for a whole answer, or `streaming`), and what the OpenAPI
    document says of it."""

    route: Route
    summary: str
    tag: str
    answer: Answerer | None = None
    streaming: Streaming | None = None
    items: Items | None = None  # an answer of batch items' results alone
    request: type[BaseModel] | None = None  # the JSON body's schema; None: the route documents no body
    response: type[BaseModel] | None = None  # the 200 answer's schema; None: any JSON value
    response_description: str = "Successful Response"
    description: str | None = None
    parameters: Sequence[dict[str, Any]] = field(default=())  # OpenAPI parameters besides {name}
    error_body: ErrorBodyMaker = error_body  # the body of an error answer ...
    error_schema: type[BaseModel] = ErrorBody  # ... and its schema
    # Where `answer` may return an EventStream: what the OpenAPI document says of that answer.
    streamed_description: str | None = None

    def __post_init__(self) -> None:
        if sum(way is not None for way in (self.answer, self.streaming, self.items)) != 1:
            raise ValueError(
                f"endpoint {self.route.operation!r}: give one of `answer`, `streaming` or `items`"
            )

    @property
    def whole(self) -> Answerer:
        """What answers a request whole: the handler, or the one made of `items`."""
        if self.items is not None:
            return self.items.answer
        assert self.answer is not None, self.route.operation
        return self.answer
