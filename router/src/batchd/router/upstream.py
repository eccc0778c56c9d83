"""Forwarding one request to one replica: headers and body out, the answer back, streamed both ways.

What matters for retries is where a failure happened. A connection that could not be opened
carried nothing, so the request may go elsewhere; once the request has been written, a reset
may come after the replica accepted it, so it is never sent again. A replica that refused a
request before accepting it says so with the `batchd-refused` header on its 503; only those
answers are retried.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from batchd.api.headers import REFUSED_HEADER, TIMEOUT_HEADER
from batchd.router.client_request import Body, ClientWatch, Send
from batchd.router.connections import ConnectFailed, Connection, Pool, SendFailed
from batchd.router.settings import RouterSettings

__all__ = ["Answer", "ConnectFailed", "SendFailed", "Upstream", "relay"]

# Headers of one connection, not of the request or the answer (RFC 9110 7.6.1), and `host`: the
# router writes its own for its own connection.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
    }
)
# Of a request, the router also writes the body's framing and the time left (see client_deadline).
_NOT_FORWARDED = HOP_BY_HOP | {b"content-length", TIMEOUT_HEADER}
# Of an answer, the router keeps a refusal's mark to itself: it has retried what could be retried,
# so a client (a composer's handle) must not send the request again on its account.
_NOT_RELAYED = HOP_BY_HOP | {REFUSED_HEADER}
# Answers up to this size with a Content-Length go to the client in one write; larger ones, and
# streams, go piece by piece as they come.
WHOLE_ANSWER_MAX_BYTES = 64 * 1024


def request_headers(
    raw: list[tuple[bytes, bytes]], replaced: frozenset[bytes] = frozenset()
) -> tuple[bytes, int | None]:
    """The client's headers as the replica gets them (all but the connection's own, and those the
    router sends its own of: `replaced`), and the Content-Length the client sent, if any."""
    lines = []
    length = None
    for name, value in raw:
        lowered = name.lower()
        if lowered == b"content-length":
            length = int(value)
        elif lowered not in _NOT_FORWARDED and lowered not in replaced:
            lines.append(b"%b: %b\r\n" % (name, value))
    return b"".join(lines), length


class Answer:
    """A replica's answer, its status and headers read, its body not yet; `release` once done."""

    def __init__(self, pool: Pool, replica: str, connection: Connection) -> None:
        self._pool, self._replica, self._connection = pool, replica, connection
        self.status = connection.status
        self.headers = [(name, value) for name, value in connection.headers if name not in _NOT_RELAYED]
        self._refused = any(name == REFUSED_HEADER for name, _ in connection.headers)
        self.content_length = next(
            (int(value) for name, value in connection.headers if name == b"content-length"), None
        )
        self.started = False  # the status line went to the client: a failure now can only cut it off
        self._released = False

    def refused(self) -> bool:
        """The replica refused the request before accepting it: it may go to another replica."""
        return self.status == 503 and self._refused

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self._connection.body()])

    def chunks(self) -> AsyncIterator[bytes]:
        return self._connection.body()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._pool.release(self._replica, self._connection)


class Upstream:
    """The keep-alive connections to every replica, for the router's lifetime."""

    def __init__(self, settings: RouterSettings) -> None:
        self.pool = Pool(
            limit=settings.upstream_connections_per_replica,
            keepalive_s=settings.upstream_keepalive_s,
            connect_timeout_s=settings.upstream_connect_timeout_s,
        )

    def close(self) -> None:
        self.pool.close()

    async def send(
        self,
        replica: str,
        method: str,
        target: str,
        headers: tuple[bytes, int | None],
        body: Body,
        extra: bytes = b"",
        watch: ClientWatch | None = None,
    ) -> Answer:
        """ConnectFailed when nothing was sent; SendFailed when the connection failed after.
        `extra`: header lines of the router's own (the time left)."""
        block, length = headers
        payload = body.payload()
        if isinstance(payload, bytes):
            framing, chunked = b"content-length: %d\r\n" % len(payload), False
        elif length is not None:
            framing, chunked = b"content-length: %d\r\n" % length, False
        else:
            framing, chunked = b"transfer-encoding: chunked\r\n", True
        head = b"%b %b HTTP/1.1\r\nhost: %b\r\n%b%b%b\r\n" % (
            method.encode(),
            target.encode("latin-1"),
            replica.encode(),
            block,
            extra,
            framing,
        )
        connection = await self.pool.acquire(replica)
        if watch is not None:
            watch.connection = connection
            if watch.left:
                connection.close()
        try:
            await connection.exchange(head, payload, chunked)
        except BaseException:
            connection.close()
            self.pool.release(replica, connection)
            raise
        return Answer(self.pool, replica, connection)


async def relay(answer: Answer, send: Send, answered: Callable[[bytes], None] | None = None) -> None:
    """The replica's answer to the client: small ones in one write (told to `answered`), the rest
    (streams) as they come."""
    length = answer.content_length
    if length is not None and length <= WHOLE_ANSWER_MAX_BYTES:
        body = await answer.read()
        if answered is not None:
            answered(body)
        answer.started = True
        await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
        await send({"type": "http.response.body", "body": body})
        return
    answer.started = True
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    async for chunk in answer.chunks():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
