"""Keep-alive HTTP/1.1 connections to replicas: a small asyncio protocol over httptools' parser.

Measured against aiohttp's client on a trivial adder (docs/performance/router.md), it takes
about a fifth of the CPU per request, and the client's CPU is most of the router's. It
does only what the router needs: one request at a time per connection, bodies by Content-Length
or chunked, answers streamed with back-pressure both ways, and failures told apart by where they
happened (no connection at all, or lost after the request was written).
"""

from __future__ import annotations

import asyncio
import collections
import select
import time
from collections.abc import AsyncIterator

import httptools

# Body bytes read ahead of the client before reading from the replica pauses.
READ_AHEAD_BYTES = 256 * 1024


class ConnectFailed(Exception):
    """No connection to the replica could be opened: nothing of the request was sent."""


class SendFailed(Exception):
    """The request was (at least partly) written and then the connection failed or was closed."""


class Connection(asyncio.Protocol):
    """One connection; `exchange` writes a request, then `status`, `headers` and `body()` are its answer."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = time.monotonic()
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self._head: asyncio.Future[None] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._more: asyncio.Future[None] | None = None
        self._error: Exception | None = None
        self._writable: asyncio.Future[None] | None = None
        self._paused = False

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._fail(SendFailed(f"connection lost: {exc or 'closed by the replica'}"))
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(SendFailed(f"malformed answer: {error}"))
            self.close()

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- httptools callbacks -----------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > READ_AHEAD_BYTES and self.transport is not None and not self._paused:
            self.transport.pause_reading()
            self._paused = True
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        if not self.parser.should_keep_alive():
            self.close()
        self._wake()

    # -- the exchange ------------------------------------------------------------------------------
    async def exchange(self, head: bytes, body: bytes | AsyncIterator[bytes], chunked: bool) -> None:
        """Write the request and wait for the answer's status line and headers."""
        assert self.transport is not None
        if self.closed:  # closed by the replica while idle, a moment ago: nothing was written
            raise ConnectFailed("the idle connection was closed before the request was written")
        self._head = asyncio.get_running_loop().create_future()
        if isinstance(body, bytes):
            self.transport.write(head + body)
        else:
            self.transport.write(head)
            async for chunk in body:
                if self.closed:
                    break
                self.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                if self._writable is not None:
                    await self._writable
            if chunked and not self.closed:
                self.transport.write(b"0\r\n\r\n")
        await self._head

    async def body(self) -> AsyncIterator[bytes]:
        """The answer's body as it arrives; SendFailed if the connection is lost before its end."""
        while True:
            while self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._paused and self._buffered <= READ_AHEAD_BYTES // 2 and self.transport is not None:
                    self.transport.resume_reading()
                    self._paused = False
                yield chunk
            if self.complete:
                return
            if self._error is not None:
                raise self._error
            self._more = asyncio.get_running_loop().create_future()
            await self._more

    def reusable(self) -> bool:
        return self.complete and not self.closed and self._error is None

    def dropped(self) -> bool:
        """Whether the replica closed or reset this idle connection before the loop noticed: its
        socket is readable though no answer is due (urllib3's check before reusing a connection).
        A replica killed a moment ago leaves such connections in the pool; one request written to
        it would fail after it was sent, and could not be retried elsewhere."""
        if self.closed or self.transport is None:
            return True
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    def reset_for_next(self) -> None:
        self.status, self.headers, self.complete, self._error = 0, [], False, None
        self._chunks.clear()
        self._buffered = 0
        self._head = self._more = None
        self.idle_since = time.monotonic()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: Exception) -> None:
        self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        if self._more is not None and not self._more.done():
            self._more.set_result(None)


class Pool:
    """Idle keep-alive connections per replica (`host:port`), at most `limit` open per replica."""

    def __init__(self, *, limit: int, keepalive_s: float, connect_timeout_s: float) -> None:
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self.limit = limit
        self._idle: dict[str, list[Connection]] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}

    async def acquire(self, replica: str) -> Connection:
        if self.limit:
            await self._slots.setdefault(replica, asyncio.Semaphore(self.limit)).acquire()
        idle = self._idle.get(replica)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if now - connection.idle_since < self.keepalive_s and not connection.dropped():
                return connection
            connection.close()
        try:
            return await self._connect(replica)
        except BaseException:
            self._free(replica)
            raise

    def release(self, replica: str, connection: Connection) -> None:
        """Back to the pool if its answer was read to the end on a connection that stays open."""
        if connection.reusable():
            connection.reset_for_next()
            self._idle.setdefault(replica, []).append(connection)
        else:
            connection.close()
        self._free(replica)

    def forget(self, replica: str) -> None:
        """The replica left its deployment: its idle connections close (those in use close when
        their answers end, as the replica goes)."""
        for connection in self._idle.pop(replica, []):
            connection.close()

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    async def _connect(self, replica: str) -> Connection:
        host, _, port = replica.rpartition(":")
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await asyncio.get_running_loop().create_connection(
                    Connection, host.strip("[]"), int(port)
                )
        except (OSError, TimeoutError) as error:
            raise ConnectFailed(f"{replica}: {error or type(error).__name__}") from None
        return connection

    def _free(self, replica: str) -> None:
        if self.limit:
            self._slots[replica].release()
