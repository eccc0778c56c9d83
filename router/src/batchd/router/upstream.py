"""The router's side of the connection to a replica: a keep-alive pool, bodies streamed both ways.

What matters for retries is where a failure happened. A connection that could not be opened
carried nothing, so the request may go elsewhere; once the request has been written, a reset
may come after the replica accepted it, so it is never sent again. A replica that refused a
request before accepting it says so with the `batchd-refused` header on its 503; only those
answers are retried.

aiohttp's client, chosen by measurement against a small asyncio protocol over httptools' parser
(see router/bench_upstream.py and the router's README section in the report).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from multidict import CIMultiDict

from batchd.router.settings import RouterSettings

# Set by a replica on a 503 for a request it did not accept (queue full, draining, stalled,
# loading): its value is the reason. Nothing of the request was computed; another replica may take it.
REFUSED_HEADER = "batchd-refused"
# Headers of one connection, not of the request or the answer (RFC 9110 7.6.1), and `host`.
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
# Answers up to this size with a Content-Length go to the client in one write; larger ones, and
# streams, go piece by piece as they come.
WHOLE_ANSWER_MAX_BYTES = 64 * 1024


# ASGI's callables, as uvicorn passes them.
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ConnectFailed(Exception):
    """No connection to the replica could be opened: nothing of the request was sent."""


class SendFailed(Exception):
    """The request was (at least partly) written and then the connection failed or was closed."""


class ClientGone(Exception):
    """The client went away while sending its body."""


class Body:
    """A request body on its way to a replica: passed on as it arrives, kept up to `keep_max_bytes`
    so that it can be sent again to another replica after a refusal."""

    def __init__(self, first: bytes, more: bool, receive: Receive, keep_max_bytes: int) -> None:
        self._chunks = [first]
        self._more = more
        self._receive = receive
        self._size = len(first)
        self._keep_max = keep_max_bytes
        self.replayable = self._size <= keep_max_bytes

    def payload(self) -> bytes | AsyncIterator[bytes]:
        if not self._more:
            return self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        return self._stream()

    async def _stream(self) -> AsyncIterator[bytes]:
        for chunk in list(self._chunks):
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


def request_headers(raw: list[tuple[bytes, bytes]]) -> CIMultiDict[str]:
    """The client's headers for the replica: all but the connection's own."""
    return CIMultiDict(
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in raw
        if name.lower() not in HOP_BY_HOP
    )


def answer_headers(raw: tuple[tuple[bytes, bytes], ...]) -> list[tuple[bytes, bytes]]:
    """The replica's answer headers for the client: all but the connection's own."""
    return [(name, value) for name, value in raw if name.lower() not in HOP_BY_HOP]


def refused(response: aiohttp.ClientResponse) -> bool:
    """The replica refused the request before accepting it: it may go to another replica."""
    return response.status == 503 and REFUSED_HEADER in response.headers


class Upstream:
    """One pool of keep-alive connections to every replica, for the router's lifetime."""

    def __init__(self, settings: RouterSettings) -> None:
        self.settings = settings
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> aiohttp.ClientSession:
        settings = self.settings
        connector = aiohttp.TCPConnector(
            limit=0,
            limit_per_host=settings.upstream_connections_per_replica,
            keepalive_timeout=settings.upstream_keepalive_s,
            enable_cleanup_closed=False,
            use_dns_cache=False,  # replicas are addressed by IP
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            # No total timeout of the router's own: the replica bounds every request
            # (request_timeout_s), and a stream lasts as long as the text it makes.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=settings.upstream_connect_timeout_s),
            auto_decompress=False,  # bodies pass through as the replica encoded them
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            raise_for_status=False,
        )
        return self.session

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def send(
        self, replica: str, method: str, target: str, headers: CIMultiDict[str], body: Body
    ) -> aiohttp.ClientResponse:
        """The replica's answer, its headers read and its body not yet."""
        assert self.session is not None, "Upstream.open() first"
        try:
            return await self.session.request(
                method,
                f"http://{replica}{target}",
                headers=headers,
                data=body.payload(),
                allow_redirects=False,
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as error:
            raise ConnectFailed(f"{replica}: {error}") from error
        except ClientGone:
            raise
        except (aiohttp.ClientError, TimeoutError) as error:
            raise SendFailed(f"{replica}: {type(error).__name__}: {error}") from error


async def relay(response: aiohttp.ClientResponse, send: Send) -> None:
    """The replica's answer to the client: small ones in one write, the rest (streams) as they come."""
    headers = answer_headers(response.raw_headers)
    length = response.content_length
    if length is not None and length <= WHOLE_ANSWER_MAX_BYTES:
        body = await response.read()
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    async for chunk in response.content.iter_any():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
