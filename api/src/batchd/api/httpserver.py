"""How batchd's HTTP servers (the replica, the router) run uvicorn, and stop it without resetting a
client.

On SIGTERM uvicorn closes its listener and then every idle keep-alive connection at once. A client
may have written its next request on such a connection a moment before: the request sits unread in
the socket, the close discards it, and the kernel answers the client with a reset. So a batchd
server that drains keeps its open connections, answers whatever arrives on them with
`Connection: close` (`closing`), and closes a connection itself only once it has sat idle for
IDLE_CLOSE_S with nothing waiting unread in its socket (`close_idle`).

Standard library only, and duck-typed on uvicorn's connection objects (`transport`, `cycle`), so
that the router can share it without importing the replica.
"""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

# How every batchd HTTP server runs uvicorn (the replica, the router, the benchmark's floor).
UVICORN_OPTIONS: dict[str, Any] = {
    "loop": "uvloop",
    "http": "httptools",
    "backlog": 4096,
    # Inside a pod nothing is proxied with X-Forwarded-* headers worth trusting; skip the parsing.
    "proxy_headers": False,
    # Idle keep-alive connections stay open longer than clients keep theirs (aiohttp 15 s, httpx
    # 5 s): a server that closes an idle connection races a client sending on it.
    "timeout_keep_alive": 75,
}

# A connection idle this long after SIGTERM is closed by the server (its client has had time to
# send and to be told to leave); one a client keeps using closes itself after its next answer.
IDLE_CLOSE_S = 1.0
# How often a draining server looks at its connections.
POLL_S = 0.05

# An ASGI `send`: the replica types its messages as Starlette does, the router as plain dicts.
Send = Callable[[Any], Awaitable[None]]


def closing(send: Send) -> Send:
    """`send`, with `Connection: close` on the answer: the client reconnects, elsewhere."""

    async def send_closing(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return send_closing


def close_idle(connections: Iterable[Any], idle_since: dict[Any, float], now: float) -> None:
    """One look at a draining server's connections: close each that has been idle for
    IDLE_CLOSE_S with nothing unread. `idle_since` carries when each went idle, between looks."""
    for connection in list(connections):
        if not idle(connection):
            idle_since.pop(connection, None)
        elif now - idle_since.setdefault(connection, now) >= IDLE_CLOSE_S and not unread(connection):
            connection.transport.close()


def idle(connection: Any) -> bool:
    """No request in progress on this uvicorn connection (between two keep-alive requests)."""
    cycle = getattr(connection, "cycle", None)
    return cycle is None or bool(cycle.response_complete)


def unread(connection: Any) -> int:
    """Bytes the client sent that the server has not read yet: a request on its way in."""
    sock = connection.transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        pending = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int(struct.unpack("i", pending)[0])


class HeadWithBody:
    """A connection's transport that sends an answer's head together with the first piece of its
    body: one send to the kernel instead of two. uvicorn writes the head when the answer starts
    and the body when it comes, each a system call of its own, and on a cheap model the second
    call was a tenth of the server's time per request. A head waits for the next write, and no
    longer than the current turn of the event loop (a streamed answer whose first piece is late
    still gets its head at once), nor past `close`. Everything else is the transport's own."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 100"):
            # An answer's head (a `100 Continue` is not: the client waits for it to send the body).
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def write_whole(self, data: bytes) -> None:
        """An answer that is whole, head and body: sent at once (there is nothing to wait for)."""
        self.flush()
        self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
