"""Keep-alive HTTP/1.1 connections over raw asyncio streams: what the load generator sends on.

A request is one pre-encoded `bytes` write and a response one header read plus one body read:
a full client library (httpx) costs several times more CPU per request, and every microsecond
the load generator spends on these shared cores is one the server does not get.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One pre-encoded request, sent as is on every call."""

    raw: bytes

    @classmethod
    def post_json(
        cls, host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> Request:
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {len(body)}\r\n\r\n"
        )
        return cls(head.encode("latin-1") + body)

    @classmethod
    def get(cls, host: str, port: int, path: str) -> Request:
        return cls(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode("latin-1"))


class Connection:
    """One keep-alive HTTP/1.1 connection; `call` sends a request and returns (status, body)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        # False once the server said `Connection: close` (a replica bounds its connections' age
        # and requests): the next request needs a new connection.
        self.reusable = True

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def call(self, request: Request) -> tuple[int, bytes]:
        self.writer.write(request.raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status, length, chunked, closing = parse_head(head)
        if chunked:
            body = await self._read_chunked()
        else:
            body = await self.reader.readexactly(length) if length else b""
        if closing:
            self.reusable = False
            self.close()
        return status, body

    async def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append((await self.reader.readexactly(size + 2))[:-2])  # each chunk ends in CRLF

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


def parse_head(head: bytes) -> tuple[int, int, bool, bool]:
    """Status code, Content-Length (0 if absent), whether the body is chunked, and whether the
    server closes the connection after this answer."""
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = 0
    chunked = False
    closing = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        lowered = name.strip().lower()
        if lowered == b"content-length":
            length = int(value.strip())
        elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif lowered == b"connection" and b"close" in value.lower():
            closing = True
    return status, length, chunked, closing


class RequestFailed(Exception):
    """A request got no HTTP answer (connection refused, reset, or a malformed reply)."""


class Session:
    """One client's keep-alive connection, opened on first use and reopened after a failure."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.connection: Connection | None = None

    async def send(self, request: Request) -> tuple[int, bytes]:
        try:
            if self.connection is None or not self.connection.reusable:
                self.connection = await Connection.open(self.host, self.port)
            return await self.connection.call(request)
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            self.close()
            raise RequestFailed(f"{type(error).__name__}: {error}") from error

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


class ConnectionPool:
    """Keep-alive connections for an open loop: grows up to `max_connections`; a request that
    finds none free waits for one (and that wait counts in its latency, as it would for a user)."""

    def __init__(self, host: str, port: int, max_connections: int) -> None:
        self.host, self.port, self.max_connections = host, port, max_connections
        self._idle: list[Connection] = []
        self._opened = 0
        self._freed = asyncio.Condition()

    async def take(self) -> tuple[Connection, bool]:
        """A connection, and whether it was used before (the server may have closed it since)."""
        async with self._freed:
            while not self._idle and self._opened >= self.max_connections:
                await self._freed.wait()
            if self._idle:
                return self._idle.pop(), True
            self._opened += 1
        try:
            return await Connection.open(self.host, self.port), False
        except OSError:
            async with self._freed:
                self._opened -= 1
                self._freed.notify()
            raise

    async def give_back(self, connection: Connection | None) -> None:
        """Return a connection for the next request; None for one that was closed after an error."""
        async with self._freed:
            if connection is None or not connection.reusable:
                self._opened -= 1
            else:
                self._idle.append(connection)
            self._freed.notify()

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()
