"""The client's side of a request through the router: its body as it arrives (read ahead where
the router must see it before it can route, kept where it may be sent again), and whether the
client is still there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from batchd.router.connections import Connection

# ASGI's callables, as uvicorn passes them.
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ClientGone(Exception):
    """The client went away before its answer: there is nobody left to answer."""


class Body:
    """A request body on its way to a replica: passed on as it arrives, kept up to `keep_max_bytes`
    so that it can be sent again to another replica after a refusal."""

    def __init__(self, messages: list[Message], receive: Receive, keep_max_bytes: int) -> None:
        """`messages`: what was already received of the body (at least one `http.request`)."""
        first = b"".join(message.get("body", b"") for message in messages)
        self._chunks = [first]
        self._more = bool(messages[-1].get("more_body", False))
        self._receive = receive
        self._size = len(first)
        self._keep_max = keep_max_bytes
        self.replayable = self._size <= keep_max_bytes
        self.complete = not self._more  # all of it arrived with the first messages

    def payload(self) -> bytes | AsyncIterator[bytes]:
        if not self._more:
            return self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        return self._stream()

    async def _stream(self) -> AsyncIterator[bytes]:
        for chunk in list(self._chunks):
            if chunk:
                yield chunk
        while self._more:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ClientGone("the client went away while sending its request")
            chunk = message.get("body", b"")
            self._more = message.get("more_body", False)
            self._size += len(chunk)
            if self.replayable and self._size <= self._keep_max:
                self._chunks.append(chunk)
            else:
                self.replayable, self._chunks = False, []
            if chunk:
                yield chunk


def read_all(received: list[Message]) -> bool:
    """Whether `received` holds the whole body, or the client's leaving."""
    return bool(received) and (
        received[-1]["type"] == "http.disconnect" or not received[-1].get("more_body", False)
    )


async def read_ahead(receive: Receive, received: list[Message], limit: int) -> None:
    """Read the body into `received` until it is complete, the client left, or more than
    `limit` bytes are in: the rest streams once a replica is there."""
    size = sum(len(message.get("body", b"")) for message in received)
    while not read_all(received) and size <= limit:
        message = await receive()
        received.append(message)
        size += len(message.get("body", b""))


async def until_gone(receive: Receive, received: list[Message], limit: int) -> None:
    """Read the body into `received` (as `read_ahead`); then the next message can only say the
    client left."""
    if not read_all(received):
        await read_ahead(receive, received, limit)
    if read_all(received) and received[-1]["type"] != "http.disconnect":
        received.append(await receive())


class ClientWatch:
    """Watches for the client leaving while its (fully received) request is with a replica, and
    then closes the connection to the replica: the replica sees its client leave, as it would
    without the router, and drops what it had not computed yet."""

    def __init__(self, receive: Receive) -> None:
        self.left = False
        self.connection: Connection | None = None
        task: asyncio.Future[Message] = asyncio.ensure_future(receive())
        task.add_done_callback(self._done)
        self._task: asyncio.Future[Message] | None = task

    def _done(self, task: asyncio.Future[Message]) -> None:
        if task.cancelled() or task.exception() is not None or self._task is None:
            return
        if task.result()["type"] == "http.disconnect":
            self.left = True
            if self.connection is not None:
                self.connection.close()

    def stop(self) -> None:
        """The exchange is over: what the client does now is no longer the replica's business."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
