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

The idle bound (`timeout_keep_alive`) stays uvicorn's, kept lazily: uvicorn sets a timer after
every answer and cancels it when the next request arrives, two calls into the event loop's timer
heap per request (a twentieth of the replica's event loop time on a cheap model). Here an answer
only notes when the connection went idle; one timer per connection looks then, and closes the
connection if it has been idle for the whole timeout, or looks again when it would have been.
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


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with connections bounded in requests and age (0: no bound);
    `bounded_protocol` sets the bounds."""

    max_requests = 0
    max_age_s = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, HeadWithBody(transport, self.loop)))
        self._requests = 0
        self._opened = self.loop.time()
        self._max_age_s = self.max_age_s * random.uniform(1 - AGE_JITTER, 1 + AGE_JITTER)
        self._idle_since: float | None = None  # loop time of the last answer, while idle
        self._idle_timer: asyncio.TimerHandle | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def on_headers_complete(self) -> None:
        self._requests += 1
        age_s = self.loop.time() - self._opened
        last = ends_connection(self._requests, age_s, self.max_requests, self._max_age_s)
        if self.starts_request(last):
            return
        super().on_headers_complete()
        cycle: Any = self.cycle
        if last and cycle is not None and not self.parser.should_upgrade():
            cycle.keep_alive = False  # its answer says `connection: close`; closed once complete

    def starts_request(self, last: bool) -> bool:
        """Whether the protocol answers the request whose headers just ended itself, rather than
        uvicorn's ASGI cycle (`last`: its answer is to close the connection); here, never."""
        return False

    def on_response_complete(self) -> None:
        # uvicorn's own, but for its keep-alive timer (see the module docstring).
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(self._idle_since + self.timeout_keep_alive, self._idle_check)

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this when data arrives (and when the connection is lost): busy again.
        self._idle_since = None
        super()._unset_keepalive_if_required()

    def _idle_check(self) -> None:
        self._idle_timer = None
        since = self._idle_since
        if since is None:  # busy: the next answer sets the timer again
            return
        closes_at = since + self.timeout_keep_alive
        if self.loop.time() >= closes_at:
            self.timeout_keep_alive_handler()
        else:
            self._idle_timer = self.loop.call_at(closes_at, self._idle_check)


def bounded_protocol(max_requests: int, max_age_s: float) -> type[BoundedHttpToolsProtocol]:
    """uvicorn's httptools protocol, with connections bounded in requests and age (0: no bound)."""
    bounds = {"max_requests": max_requests, "max_age_s": max_age_s}
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), bounds)
