"""The direct door: requests of batch items answered inside the connection's protocol.

On a model that costs nothing, a server's throughput is what it spends per request, and most of
what batchd spent went to uvicorn's ASGI cycle around its own front (`asgi`): a scope dict, a
cycle object and its event, a task and the coroutines it runs, the receive and send messages,
the answer's headers checked one by one. Mosec spends none of that: it answers HTTP in Rust. So
an endpoint of batch items (`endpoints.Items`: KServe V1's predict, the simple call) is answered
where uvicorn's parser hands the request over, by callbacks, through the same pipeline as the
ASGI door (`pipeline.Exchange.submit`), its answer written head and body in one send. No task
and no coroutine per request (`docs/performance/overhead.md`).

This module only translates, and decides which requests it can: an HTTP/1.1 request with a
Content-Length the pipeline accepts, on a connection with nothing else in flight, for a path
with no query and no escapes (as the ASGI scope would have it) that the pipeline routes to an
endpoint of batch items. Everything else takes uvicorn's ASGI path, unchanged: the other routes,
a chunked body, `Expect: 100-continue`, an upgrade, a request pipelined behind another, a server
bounding its concurrency, or one with its access log on (`server`).

To uvicorn's connection a direct request stands for the request's cycle (`_Prediction`):
uvicorn's pipelining, its shutdown and the drain's idle test read `cycle.response_complete` and
`cycle.keep_alive`, so the protocol sets `cycle` to it, and clears it before uvicorn's own
`connection_lost`, which would signal the cycle's events.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from batchd.api.httpserver import HeadWithBody
from batchd.replica.errors import ClientDisconnected
from batchd.replica.front.keepalive import BoundedHttpToolsProtocol
from batchd.replica.front.pipeline import CLOSE, Exchange, Pipeline, Reply, Routed


class DirectProtocol(BoundedHttpToolsProtocol):
    """The replica's connection: requests of batch items answered directly, every other request
    as uvicorn answers it; `direct_protocol` makes one for a pipeline."""

    inference: Pipeline  # the replica's (not uvicorn's `pipeline`, its queue of pipelined requests)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._direct: _Prediction | None = None  # the direct request not answered yet

    def connection_lost(self, exc: Exception | None) -> None:
        direct = self._direct
        if direct is not None:
            self._direct = None
            direct.abandon()
            if cast(Any, self.cycle) is direct:  # as in `answered`
                self.cycle = None  # type: ignore[assignment]
        super().connection_lost(exc)

    def starts_request(self, last: bool) -> bool:
        direct = self._direct_request(last)
        if direct is None:
            return False
        self._direct = direct
        self.cycle = cast(Any, direct)  # see the module docstring
        return True

    def _direct_request(self, last: bool) -> _Prediction | None:
        """A `_Prediction` when the request whose headers just ended goes direct, else None."""
        parser, cycle = self.parser, self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline:
            return None  # a request in flight on this connection, or pipelined behind one
        if self.expect_100_continue or self.limit_concurrency is not None:
            return None
        if parser.get_http_version() != "1.1" or parser.should_upgrade():
            return None
        path, query, _ = self.url.partition(b"?")
        if query or b"%" in path:
            return None
        method, server = parser.get_method(), self.server
        routed = self.inference.route_raw(method, path, None if server is None else server[1])
        if not isinstance(routed, Routed) or routed.endpoint.items is None:
            return None
        length: bytes | None = None
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                return None
        if length is None or not length.isdigit() or not self.inference.accepts_body(int(length)):
            return None
        exchange = self.inference.open(
            routed, method.decode("latin-1"), self.url.decode("latin-1"), self.headers
        )
        return _Prediction(self, exchange, parser.should_keep_alive() and not last)

    def on_body(self, body: bytes) -> None:
        direct = self._direct
        if direct is None or not direct.reading:
            super().on_body(body)
            return
        # Within the bound: its Content-Length was (`_direct_request`), and the parser holds it to it.
        direct.exchange.receive(body)

    def on_message_complete(self) -> None:
        direct = self._direct
        if direct is None or not direct.reading:
            super().on_message_complete()
            return
        direct.run()

    def answered(self, direct: _Prediction) -> None:
        """A direct request's answer is written: the connection is ready for the next."""
        if self._direct is direct:
            self._direct = None
        if cast(Any, self.cycle) is direct:  # uvicorn would reach into it as into a cycle of its own
            self.cycle = None  # type: ignore[assignment]
        self.on_response_complete()


def direct_protocol(bounded: type[BoundedHttpToolsProtocol], pipeline: Pipeline) -> type[DirectProtocol]:
    """`bounded` (uvicorn's protocol with the replica's keep-alive bounds), answering the requests
    of batch items directly, through `pipeline` (see the module docstring)."""
    return type("DirectProtocol", (DirectProtocol, bounded), {"inference": pipeline})


class _Prediction:
    """One direct request, from the end of its headers to its answer. To uvicorn's connection it
    stands for the request's cycle: `response_complete`, and `keep_alive` (cleared at shutdown)."""

    __slots__ = ("exchange", "keep_alive", "protocol", "reading", "response_complete")

    def __init__(self, protocol: DirectProtocol, exchange: Exchange, keep_alive: bool) -> None:
        self.protocol = protocol
        self.exchange = exchange
        self.keep_alive = keep_alive
        self.reading = True
        self.response_complete = False

    def run(self) -> None:
        """The body is complete: submit it, or answer why not."""
        self.reading = False
        self.exchange.submit(self._write)

    def abandon(self) -> None:
        """The client has gone: what it submitted is dropped before the model, and nothing is answered."""
        if self.reading:
            self.reading = False
            self._write(self.exchange.failed(ClientDisconnected.while_sending()))
        else:
            self.exchange.abandon(ClientDisconnected.before_answer())

    def _write(self, reply: Reply) -> None:
        """The answer, head and body, in one send, as uvicorn would write it; then the connection
        closes if it is to, or reads its next request."""
        self.response_complete = True
        protocol = self.protocol
        transport = cast(HeadWithBody, protocol.transport)  # as the bounded protocol wraps it
        if transport.is_closing():  # the client has gone: nobody to answer
            protocol.answered(self)
            return
        parts = [STATUS_LINE[reply.status]]
        for name, value in (*protocol.server_state.default_headers, *reply.headers):
            parts += (name, b": ", value, b"\r\n")
        closes = reply.closes
        if not (closes or self.keep_alive):
            closes = True
            parts += (CLOSE[0], b": ", CLOSE[1], b"\r\n")
        parts += (b"\r\n", reply.body)
        transport.write_whole(b"".join(parts))
        if closes:
            transport.close()
        protocol.answered(self)
