"""A request's deadline, passed on: the time it has left, in the `batchd-timeout-s` header.

A client may say how long it will wait (seconds, the header's value). The router holds the
request no longer than that, and tells the replica the time that is left when it sends it, so
that time spent waiting in the router is not waited again. A replica bounds every request by
`request_timeout_s` whatever the header says; with the header it can bound it by the shorter of
the two.
"""

from __future__ import annotations

import time

from batchd.api.headers import TIMEOUT_HEADER, parse_timeout_s
from batchd.router.errors import BadRequest
from batchd.router.settings import RouterSettings


def deadline_of(headers: list[tuple[bytes, bytes]]) -> float | None:
    """time.monotonic() by which the client wants its answer; None when it did not say.
    BadRequest naming the header and the value when it is not a positive number of seconds."""
    for name, value in headers:
        if name.lower() == TIMEOUT_HEADER:
            try:
                return time.monotonic() + parse_timeout_s(value)
            except ValueError as error:
                raise BadRequest(str(error)) from None
    return None


def remaining_header(deadline: float) -> bytes:
    """The header line that tells the replica the time left (milliseconds are precise enough)."""
    return b"%b: %.3f\r\n" % (TIMEOUT_HEADER, max(0.001, deadline - time.monotonic()))


def answer_bound_s(request_timeout_s: float, settings: RouterSettings, deadline: float | None) -> float:
    """Seconds to wait for a replica's answer to start: the deployment's `request_timeout_s` (after
    which the replica answers its own 504) plus `answer_margin_s` for that answer to arrive, or
    the time the client has left when that is shorter. The router then answers 504 itself."""
    bound = request_timeout_s + settings.answer_margin_s
    return bound if deadline is None else max(0.0, min(bound, deadline - time.monotonic()))
