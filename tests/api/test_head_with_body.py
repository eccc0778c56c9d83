"""`HeadWithBody`: an answer's head leaves with its body, but never waits for a body that is late,
and a `100 Continue` leaves at once (its client sends the body only after it)."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from batchd.api.httpserver import HeadWithBody
from batchd.testing.waiting import eventually_async


class _Protocol(HttpToolsProtocol):
    def connection_made(self, transport: Any) -> None:
        super().connection_made(HeadWithBody(transport, self.loop))  # type: ignore[arg-type]


async def test_a_late_body_does_not_hold_the_head_and_100_continue_is_not_held() -> None:
    release = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()  # with Expect: 100-continue, reading the body sends the 100 first
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await release.wait()
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, http=_Protocol, lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    writer = None
    try:
        await eventually_async(lambda: server.started, timeout_s=10, what="uvicorn listening")
        port = server.servers[0].sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        async with asyncio.timeout(5):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
        writer.write(b"hi")
        async with asyncio.timeout(5):  # the head comes before the body exists
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        release.set()
        async with asyncio.timeout(5):
            assert await reader.readexactly(2) == b"ok"
    finally:
        release.set()
        if writer is not None:
            writer.close()
        server.should_exit = True
        async with asyncio.timeout(10):
            await serving
