"""A request's deadline, passed on: the time it has left, in the `batchd-timeout-s` header.

A client may say how long it will wait (seconds, the header's value). The router holds the
request no longer than that, and tells the replica the time that is left when it sends it, so
that time spent waiting in the router is not waited again. A replica bounds every request by
`request_timeout_s` whatever the header says; with the header it can bound it by the shorter of
the two.
"""

from __future__ import annotations

import math
import time

from batchd.router.errors import BadRequest

TIMEOUT_HEADER = b"batchd-timeout-s"


def deadline_of(headers: list[tuple[bytes, bytes]]) -> float | None:
    """time.monotonic() by which the client wants its answer; None when it did not say.
    BadRequest naming the header and the value when it is not a positive number of seconds."""
    for name, value in headers:
        if name.lower() == TIMEOUT_HEADER:
            try:
                seconds = float(value)
            except ValueError:
                seconds = math.nan
            if not seconds > 0 or math.isinf(seconds):
                raise BadRequest(
                    f"header {TIMEOUT_HEADER.decode()}: expected a positive number of seconds, "
                    f"got {value.decode('latin-1')!r}"
                )
            return time.monotonic() + seconds
    return None


def remaining_header(deadline: float) -> bytes:
    """The header line that tells the replica the time left (milliseconds are precise enough)."""
    return b"%b: %.3f\r\n" % (TIMEOUT_HEADER, max(0.001, deadline - time.monotonic()))
