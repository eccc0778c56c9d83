"""The HTTP headers the router and the replicas speak to each other, named once.

Both sides import these names, so a replica's refusal and a router's retry, or a router's time
left and a replica's deadline, can never disagree on spelling. Header names are lower-case
bytes, the way ASGI servers hand them over.
"""

from __future__ import annotations

import math

# Set by a replica on a 503 for a request it refused before accepting it (queue full, draining,
# stalled, loading); the value is the reason. Nothing of the request reached the batcher, so a
# router may send it to another replica. Never set once a request was accepted.
REFUSED_HEADER = b"batchd-refused"

# Seconds the client still waits for its answer. A client may set it; the router holds a request
# no longer than that and replaces it with the time left when it forwards the request; a replica
# bounds the request by the shorter of this and its `request_timeout_s`.
TIMEOUT_HEADER = b"batchd-timeout-s"

# The priority class a request asks for: a name from its deployment's batching.priority_classes.
PRIORITY_HEADER = b"batchd-priority"

# Who sends the request, for fair shares between the callers of one priority class (any string).
FAIRNESS_HEADER = b"batchd-fairness-id"

# Set by a composer's handles on their calls: the calling deployment's name. Such a call carries the
# class of the request it was made for, a name from the composer's classes (`batchd.api.priority`).
CALLED_BY_HEADER = b"batchd-called-by"


# Stamped by the router alone (`batchd.api.stamp`): the caller's tenant, as the router authenticated
# it. With PRIORITY_HEADER (the class the router granted), FAIRNESS_HEADER (the caller within the
# tenant) and CALLED_BY_HEADER, it is signed in STAMP_HEADER; a replica believes them only so.
TENANT_HEADER = b"batchd-tenant"
STAMP_HEADER = b"batchd-stamp"

# Credentials a client presents to the router: `Authorization: Bearer` (an API key or a
# ServiceAccount token) or `x-api-key` (an API key). The router never forwards them.
AUTHORIZATION_HEADER = b"authorization"
API_KEY_HEADER = b"x-api-key"

# What the router removes from every client's request before it stamps its own: the credentials,
# and every header whose meaning is the router's to decide.
CLIENT_IDENTITY_HEADERS = frozenset(
    {
        AUTHORIZATION_HEADER,
        API_KEY_HEADER,
        TENANT_HEADER,
        STAMP_HEADER,
        PRIORITY_HEADER,
        FAIRNESS_HEADER,
        CALLED_BY_HEADER,
    }
)


def parse_timeout_s(value: bytes) -> float:
    """The seconds a `batchd-timeout-s` value names; ValueError naming the header and the value
    unless it is a positive, finite number."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(
            f"header {TIMEOUT_HEADER.decode()}: expected a positive number of seconds, "
            f"got {value.decode('latin-1')!r}"
        )
    return seconds
