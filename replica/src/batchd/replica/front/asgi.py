"""The ASGI door: inference requests through uvicorn's ASGI cycle, in front of the FastAPI app.

Every request to a batching server pays the framework's per-request cost, and with a cheap
model that cost is the throughput: FastAPI's middleware and dependency layers took about three
quarters of the time per request on the trivial handler. So the inference routes are answered
here, by the one pipeline (`pipeline`), and everything else (health, metadata, /load, /metrics,
/docs) falls through to FastAPI, where convenience matters more than microseconds.

This module only translates: the scope's head and the receive messages into the pipeline's
exchange, and its reply (or its stream of events) into send messages.
"""

from __future__ import annotations

from contextlib import aclosing
from functools import partial

from starlette.types import ASGIApp, Receive, Scope, Send

from batchd.api.httpserver import closing
from batchd.api.stamp import request_target
from batchd.replica.errors import ClientDisconnected
from batchd.replica.front.endpoints import Endpoint, EventStream
from batchd.replica.front.gate import Gate
from batchd.replica.front.pipeline import CLOSE, Exchange, Pipeline, Reply
from batchd.replica.replica import Replica


class InferenceRoutes:
    """ASGI: answers the endpoints' routes through the pipeline and hands every other request to `app`."""

    def __init__(self, app: ASGIApp, replica: Replica, endpoints: tuple[Endpoint, ...], gate: Gate) -> None:
        self.app = app
        self.replica = replica
        self.pipeline = Pipeline(replica, endpoints, gate)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        pipeline = self.pipeline
        server = scope.get("server")
        routed = pipeline.route(scope["method"], scope["path"], None if server is None else server[1])
        if routed is None:
            await self.app(scope, receive, closing(send) if pipeline.closes_connections else send)
            return
        if isinstance(routed, Reply):
            await _send(send, routed)
            return
        exchange = pipeline.open(routed, scope["method"], request_target(scope), scope["headers"])
        try:
            await _read_body(receive, exchange)
        except Exception as error:
            await _send(send, exchange.failed(error))
            return
        except BaseException:
            exchange.dropped()
            raise
        answer = await exchange.answer(partial(_disconnected, receive))
        if isinstance(answer, Reply):
            await _send(send, answer)
        else:
            await _send_stream(send, exchange, answer)


async def _send(send: Send, reply: Reply) -> None:
    await send({"type": "http.response.start", "status": reply.status, "headers": reply.headers})
    await send({"type": "http.response.body", "body": reply.body})


async def _send_stream(send: Send, exchange: Exchange, stream: EventStream) -> None:
    """The status line goes with the first event, so that anything that fails before it is an
    ordinary error answer, and anything after it the last event."""
    headers = [*stream.headers, CLOSE] if exchange.pipeline.closes_connections else stream.headers
    started = False
    try:
        async with aclosing(stream.events) as events:
            async for chunk in events:
                if not started:
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    started = True
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except Exception as error:
        if not started:
            await _send(send, exchange.failed(error))
        else:
            await send({"type": "http.response.body", "body": exchange.failed_midstream(error, stream)})
        return
    except BaseException:
        exchange.dropped()
        raise
    if not started:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
    exchange.succeeded()


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (the body has been read, so nothing else can arrive)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Receive, exchange: Exchange) -> None:
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected.while_sending()
        exchange.receive(message.get("body", b""))
        more = message.get("more_body", False)
