"""What the plain ASGI servers of the tests and benchmarks (stand-ins for a replica or a peer)
share: reading a request's whole body."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]


async def read_body(receive: Receive) -> bytes:
    """The request's body, from every `http.request` message until the last."""
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body
