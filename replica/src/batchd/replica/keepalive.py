"""A bound on how long a client keeps one keep-alive connection to this replica.

A client that bypasses the router (straight to the deployment's Service) holds a pool of
keep-alive connections, and kube-proxy balances connections, not requests: the replicas that
were there when the pool filled get its traffic for as long as the connections live, and a
replica added by a scale-up gets none. So a connection ends after a bounded number of requests
(nginx's `keepalive_requests`) or a bounded age (gRPC's `MAX_CONNECTION_AGE`): the answer to
the request that passes the bound says `Connection: close` and the connection closes once that
answer is complete, never in the middle of a request or a stream, and the client's next request
opens a new connection, which the Service may give to any replica.

The mechanism is uvicorn's own: a request's cycle with `keep_alive = False` gets
`connection: close` on its answer and the connection is closed after it (as for an HTTP/1.0
client). The bounds are checked once per request, when its headers are complete.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from batchd.api.httpserver import HeadWithBody

# Each connection's age bound is drawn within this fraction of the setting, as gRPC jitters
# MAX_CONNECTION_AGE: the connections a pool opened together do not all close together.
AGE_JITTER = 0.1


def ends_connection(requests: int, age_s: float, max_requests: int, max_age_s: float) -> bool:
    """Whether the answer to a connection's `requests`-th request (counting it) closes it: at
    `max_requests` requests or once it is `max_age_s` old; a bound of 0 is no bound. The rule of
    nginx's `keepalive_requests` and gRPC's `MAX_CONNECTION_AGE`."""
    return (max_requests > 0 and requests >= max_requests) or (max_age_s > 0 and age_s >= max_age_s)


def bounded_protocol(max_requests: int, max_age_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, with connections bounded in requests and age (0: no bound)."""

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(cast(asyncio.Transport, HeadWithBody(transport, self.loop)))
            self._requests = 0
            self._opened = self.loop.time()
            self._max_age_s = max_age_s * random.uniform(1 - AGE_JITTER, 1 + AGE_JITTER)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            cycle: Any = self.cycle
            if cycle is None or self.parser.should_upgrade():
                return
            self._requests += 1
            if ends_connection(
                self._requests, self.loop.time() - self._opened, max_requests, self._max_age_s
            ):
                cycle.keep_alive = False  # its answer says `connection: close`; closed once complete

    return BoundedHttpToolsProtocol
