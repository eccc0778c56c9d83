"""What a Service does with a keep-alive client: each new connection goes to the next ready
endpoint (kube-proxy balances connections), and stays there for as long as it is open."""

from __future__ import annotations

import asyncio
import contextlib


class ConnectionBalancer:
    """A TCP proxy on loopback: a new connection goes to the next of `endpoints` (round robin);
    bytes pass both ways untouched. `endpoints` may change at any time, as a Service's do."""

    def __init__(self, endpoints: list[tuple[str, int]]) -> None:
        self.endpoints = endpoints
        self.port = 0
        self._turn = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Future[tuple[None, None]]] = set()

    async def __aenter__(self) -> ConnectionBalancer:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.endpoints[self._turn % len(self.endpoints)]
        self._turn += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        pipe = asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        self._pipes.add(pipe)
        pipe.add_done_callback(self._pipes.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await pipe


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()
