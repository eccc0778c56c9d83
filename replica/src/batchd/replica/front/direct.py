"""The direct path: KServe V1 predictions answered inside the connection's protocol.

On a model that costs nothing, a server's throughput is what it spends per request, and most of
what batchd spent went to uvicorn's ASGI cycle around its own front (`asgi`): a scope dict,
a cycle object and its event, a task and the coroutines it runs, the receive and send messages,
the answer's headers checked one by one. Mosec spends none of that: it answers HTTP in Rust. So
the commonest inference request is answered where uvicorn's parser hands it over, by callbacks:
its body decoded, validated and queued as the front does it (`Replica.submit`), and, once its
results are set, its answer written, head and body in one send. No task and no coroutine per
request (0.6 of the CPU per request on the trivial adder: `docs/performance/overhead.md`).

What goes direct: `POST /v1/models/{name}:predict` whose path is byte for byte this replica's
model (no query string, no escapes), HTTP/1.1 with a Content-Length of at most `max_body_bytes`,
on a connection with nothing else in flight, while the replica is not draining and its items go
to the batcher (not to token-level generation). Everything else takes uvicorn's ASGI path,
unchanged: the other routes and protocols, a chunked body, `Expect: 100-continue`, an upgrade, a
request pipelined behind another, a server with its access log on (`batchd.replica.cli`).

A direct request gets what the ASGI path would give it (the tests send the same requests down
both): the same answers and error bodies, from the same table; the same deadlines
(`request_timeout_s`, or the client's `batchd-timeout-s` where sooner); the same keep-alive
bounds, `Connection: close` once the replica drains, and the same metrics. A client that leaves
cancels its items before they reach the model.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from batchd.api.headers import TIMEOUT_HEADER
from batchd.api.httpserver import HeadWithBody
from batchd.api.routes import KSERVE_V1_PREDICT, MODEL_NAME
from batchd.replica.errors import ClientDisconnected, error_body
from batchd.replica.front import answers
from batchd.replica.front.asgi import InferenceRoutes
from batchd.replica.front.endpoints import parse_json
from batchd.replica.front.gate import Gate
from batchd.replica.front.keepalive import BoundedHttpToolsProtocol
from batchd.replica.front.protocols.kserve_v1 import decode_instances, predictions
from batchd.replica.json_encoding import json_bytes
from batchd.replica.replica import Replica
from batchd.replica.traces import RequestTrace
from batchd.replica.waiting import Submitted


class DirectProtocol(BoundedHttpToolsProtocol):
    """The replica's connection: KServe V1 predictions for `replica`'s model answered directly,
    every other request as uvicorn answers it; `direct_protocol` makes one for a replica."""

    replica: Replica
    gate: Gate
    metrics_port = 0
    path = b""  # the one path answered directly
    max_body = 0

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

    def on_headers_complete(self) -> None:
        direct = self._direct_request()
        if direct is None:
            super().on_headers_complete()
            return
        self._direct = direct
        # To uvicorn (its pipelining, its shutdown, the drain's idle test) this is the request's cycle.
        self.cycle = cast(Any, direct)

    def _direct_request(self) -> _Prediction | None:
        """A `_Prediction` when the request whose headers just ended goes direct, else None."""
        if self.url != self.path or self.parser.get_method() != b"POST" or self.expect_100_continue:
            return None
        if self.metrics_port and self.server is not None and self.server[1] == self.metrics_port:
            return None  # the front answers it: nothing but /metrics is served there
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline:
            return None
        if self.parser.get_http_version() != "1.1" or self.parser.should_upgrade():
            return None
        replica = self.replica
        if replica.batcher.draining or replica.schedules_tokens or self.limit_concurrency is not None:
            return None
        length: bytes | None = None
        timeout: bytes | None = None  # the client's batchd-timeout-s (names are lower case)
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == TIMEOUT_HEADER:
                timeout = value
            elif name == b"transfer-encoding":
                return None
        if length is None or not length.isdigit() or int(length) > self.max_body:
            return None
        keep_alive = self.parser.should_keep_alive()
        if self.counts_last_request():
            keep_alive = False
        tracing = replica.tracing
        trace = (
            None
            if tracing is None
            else tracing.request_started(
                KSERVE_V1_PREDICT.operation, KSERVE_V1_PREDICT.path, "POST", self.path.decode(), self.headers
            )
        )
        return _Prediction(self, replica, keep_alive, timeout, trace)

    def on_body(self, body: bytes) -> None:
        direct = self._direct
        if direct is None or not direct.reading:
            super().on_body(body)
            return
        direct.chunks.append(body)

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


def direct_protocol(bounded: type[BoundedHttpToolsProtocol], app: InferenceRoutes) -> type[DirectProtocol]:
    """`bounded` (uvicorn's protocol with the replica's keep-alive bounds), answering the KServe V1
    predictions of `app`'s replica directly, past the same gate (see the module docstring)."""
    replica = app.replica
    attributes = {
        "replica": replica,
        "gate": app.gate,
        "metrics_port": app.metrics_port,
        "path": KSERVE_V1_PREDICT.path.replace(MODEL_NAME, replica.model_name).encode(),
        "max_body": replica.settings.max_body_bytes,
    }
    return type("DirectProtocol", (DirectProtocol, bounded), attributes)


class _Prediction:
    """One direct request, from the end of its headers to its answer. To uvicorn's connection it
    stands for the request's cycle: `response_complete`, and `keep_alive` (cleared at shutdown)."""

    __slots__ = (
        "chunks",
        "keep_alive",
        "protocol",
        "reading",
        "replica",
        "response_complete",
        "started",
        "submitted",
        "timeout",
        "trace",
    )

    def __init__(
        self,
        protocol: DirectProtocol,
        replica: Replica,
        keep_alive: bool,
        timeout: bytes | None,
        trace: RequestTrace | None,
    ) -> None:
        self.trace = trace
        self.protocol = protocol
        self.timeout = timeout  # its batchd-timeout-s
        self.replica = replica
        self.keep_alive = keep_alive
        self.chunks: list[bytes] = []
        self.reading = True
        self.response_complete = False
        self.submitted: Submitted | None = None
        self.started = answers.opened(replica)

    def run(self) -> None:
        """The body is complete: queue the request's items, or answer why not. Runs inside the
        parser's callback, so it raises nothing (an exception would read as a malformed request)."""
        self.reading = False
        try:
            # The client is watched by the protocol (`abandon`), not by a coroutine of its own.
            protocol = self.protocol
            caller = protocol.gate.caller("POST", protocol.path.decode(), protocol.headers)
            client = answers.client_waiting(self.timeout, None, caller, self.trace)
            items = decode_instances(parse_json(b"".join(self.chunks)))
            self.submitted = self.replica.submit(items, "instances", client)
        except Exception as error:
            self._failed(error)
            return
        self.submitted.waiter.add_done_callback(self._resolved)

    def abandon(self) -> None:
        """The client has gone: what it queued is dropped before the model, and nothing is answered."""
        if self.reading:
            self.reading = False
            self._failed(ClientDisconnected.while_sending())
        elif self.submitted is not None:
            self.submitted.abandon(ClientDisconnected.before_answer())

    def _resolved(self, waiter: asyncio.Future[Any]) -> None:
        submitted = self.submitted
        assert submitted is not None
        try:
            body = json_bytes(predictions(submitted.results()))
        except Exception as error:
            self._failed(error)
            return
        except asyncio.CancelledError:  # not by its watch nor its client: nothing else cancels it
            self._failed(ClientDisconnected("the request was cancelled before its answer was ready"))
            return
        finally:
            submitted.close()
        answers.succeeded(self.replica, self.started, self.trace)
        self._write(200, answers.JSON_HEADERS, body)

    def _failed(self, error: BaseException) -> None:
        answers.failed(self.replica, error, self.started, self.trace)
        answer, body = answers.error_answer(error, error_body)
        self._write(answer.status, answer.headers, body)

    def _write(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """The answer, head and body, in one send, as uvicorn would write it; then the connection
        closes if it is to, or reads its next request."""
        self.response_complete = True
        protocol = self.protocol
        transport = cast(HeadWithBody, protocol.transport)  # as the bounded protocol wraps it
        if transport.is_closing():  # the client has gone: nobody to answer
            protocol.answered(self)
            return
        keep_alive = self.keep_alive and not self.replica.batcher.draining
        parts = [STATUS_LINE[status]]
        for name, value in (*protocol.server_state.default_headers, *headers):
            parts += (name, b": ", value, b"\r\n")
        parts += (b"content-length: ", str(len(body)).encode(), b"\r\n")
        if not keep_alive:
            parts.append(b"connection: close\r\n")
        parts += (b"\r\n", body)
        transport.write_whole(b"".join(parts))
        if not keep_alive:
            transport.close()
        protocol.answered(self)
