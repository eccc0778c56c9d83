"""The router's stamp: who a request's caller is and what it was granted, signed for the replicas.

The router authenticates the caller, grants it a class, and sends the replica what it decided in
headers of its own (`STAMPED_HEADERS`: the tenant, the class, the caller within the tenant, the
composer that calls), having removed whatever the client sent under those names. It signs them
with the deployment's key (a Secret the operator makes per deployment and mounts into the replicas;
the router reads it from the API server): an HMAC-SHA256 over the method, the target (path and
query), the time, a nonce and every stamped header, in `STAMP_HEADER`.

A replica believes stamped headers only with a valid signature made less than `MAX_AGE_S` ago
(either side, for clocks a little apart), and a nonce it has not seen in that time
(`ReplayGuard`): a stamp copied from one request and sent again, or onto another path, is refused.
So a replica does not depend on the network to tell a router's request from anyone else's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from batchd.api.headers import CALLED_BY_HEADER, FAIRNESS_HEADER, PRIORITY_HEADER, STAMP_HEADER, TENANT_HEADER

__all__ = [
    "MAX_AGE_S",
    "STAMPED_HEADERS",
    "BadStamp",
    "ReplayGuard",
    "Stamp",
    "WrongKey",
    "request_target",
    "signed_headers",
    "verified",
]

VERSION = b"v1"
# A stamp is good this long after (and before, for clocks apart) the router made it, in seconds:
# the router stamps a request as it sends it, after any hold, so only the network and the clocks'
# difference come between.
MAX_AGE_S = 30.0
# The headers a stamp covers, in the order they are signed. Nobody but the router may set them.
STAMPED_HEADERS = (TENANT_HEADER, PRIORITY_HEADER, FAIRNESS_HEADER, CALLED_BY_HEADER)
NONCE_BYTES = 12
# The longest caller id a stamp carries (the OpenAI `user`, or the fairness id a client sends).
MAX_CALLER_CHARS = 256


class BadStamp(ValueError):
    """Stamped headers that are not signed by the deployment's key, are stale, or were seen before
    (a 401); the message says which, never the key or the signature."""


class WrongKey(BadStamp):
    """A well-formed stamp whose signature is not this key's (another key's, or a forger's)."""


@dataclass(frozen=True, slots=True)
class Stamp:
    """What the router decided about a request: its tenant, its class, who within the tenant sent
    it (for fair shares there; "" for nobody in particular), and the composing deployment that
    calls ("" for none)."""

    tenant: str
    priority: str
    caller: str = ""
    called_by: str = ""

    def values(self) -> tuple[bytes, bytes, bytes, bytes]:
        return (
            self.tenant.encode("latin-1"),
            self.priority.encode("latin-1"),
            _header_safe(self.caller).encode("latin-1"),
            self.called_by.encode("latin-1"),
        )


def _header_safe(caller: str) -> str:
    """A caller id as a header may carry it: printable ASCII, bounded; anything else by its digest,
    which tells callers apart as well."""
    if len(caller) <= MAX_CALLER_CHARS and caller.isascii() and caller.isprintable():
        return caller
    return "sha256:" + hashlib.sha256(caller.encode("utf-8", "surrogatepass")).hexdigest()


def _signature(
    key: bytes, method: bytes, target: bytes, at: bytes, nonce: bytes, values: Iterable[bytes]
) -> bytes:
    message = b"\n".join((VERSION, method, target, at, nonce, *values))
    return hmac.new(key, message, hashlib.sha256).digest()


def signed_headers(
    key: bytes, method: str, target: str, stamp: Stamp, now: float | None = None
) -> list[tuple[bytes, bytes]]:
    """The headers that carry `stamp` to a replica for `method target`, signed with `key`: each
    stamped header (empty ones left out) and the signature."""
    at = b"%d" % int((time.time() if now is None else now) * 1000)
    nonce = base64.urlsafe_b64encode(os.urandom(NONCE_BYTES))
    values = stamp.values()
    signature = _signature(key, method.encode("latin-1"), target.encode("latin-1"), at, nonce, values)
    headers = [(name, value) for name, value in zip(STAMPED_HEADERS, values, strict=True) if value]
    encoded = base64.urlsafe_b64encode(signature)
    headers.append((STAMP_HEADER, b"%b t=%b n=%b s=%b" % (VERSION, at, nonce, encoded)))
    return headers


def request_target(scope: Mapping[str, Any]) -> str:
    """An ASGI request's target as a stamp signs it: its raw path (as sent, percent-encoding and
    all) and its query. The router and the replica both read it here, so they sign and check the
    same bytes."""
    raw = scope.get("raw_path") or scope["path"].encode("utf-8")
    target = raw.decode("latin-1")
    query = scope.get("query_string")
    return f"{target}?{query.decode('latin-1')}" if query else target


def stamp_present(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request carries a stamp, or a header that only a stamp may set (the tenant)."""
    return any(name.lower() in (STAMP_HEADER, TENANT_HEADER) for name, _ in headers)


def verified(
    key: bytes,
    method: str,
    target: str,
    headers: Iterable[tuple[bytes, bytes]],
    guard: ReplayGuard,
    now: float | None = None,
) -> Stamp:
    """The stamp a request carries, once its signature, age and nonce are checked; BadStamp saying
    what is wrong otherwise (no stamp at all is BadStamp too: the caller decides whether an
    unstamped request may be served)."""
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        lowered = name.lower()
        if lowered == STAMP_HEADER or lowered in STAMPED_HEADERS:
            if lowered in found:
                raise BadStamp(f"header {lowered.decode()} is given twice")
            found[lowered] = value
    stamp = found.get(STAMP_HEADER)
    if stamp is None:
        raise BadStamp("the request is not signed by batchd's router")
    fields = dict(part.split(b"=", 1) for part in stamp.split(b" ")[1:] if b"=" in part)
    if not stamp.startswith(VERSION + b" ") or set(fields) != {b"t", b"n", b"s"}:
        raise BadStamp(f"header {STAMP_HEADER.decode()}: not a stamp of batchd's router")
    at, nonce = fields[b"t"], fields[b"n"]
    try:
        signature = base64.urlsafe_b64decode(fields[b"s"])
        made_at = int(at) / 1000
    except ValueError:
        raise BadStamp(f"header {STAMP_HEADER.decode()}: not a stamp of batchd's router") from None
    values = [found.get(name, b"") for name in STAMPED_HEADERS]
    expected = _signature(key, method.encode("latin-1"), target.encode("latin-1"), at, nonce, values)
    if not hmac.compare_digest(signature, expected):
        raise WrongKey("the request's stamp is not signed with this deployment's key")
    clock = time.time() if now is None else now
    if abs(clock - made_at) > MAX_AGE_S:
        raise BadStamp(f"the request's stamp was made {clock - made_at:.0f} s ago (at most {MAX_AGE_S:.0f})")
    if not guard.first(nonce, clock):
        raise BadStamp("the request's stamp was used before")
    tenant, priority, caller, called_by = (value.decode("latin-1") for value in values)
    return Stamp(tenant, priority, caller, called_by)


class ReplayGuard:
    """The nonces of the stamps seen in the last `MAX_AGE_S` (twice, for clocks apart): a stamp is
    good once. Bounded by time, not count: at most the requests of that window are remembered."""

    def __init__(self, window_s: float = 2 * MAX_AGE_S) -> None:
        self.window_s = window_s
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def first(self, nonce: bytes, now: float) -> bool:
        """Whether `nonce` is new (then remembered); forgets the nonces older than the window."""
        seen = self._seen
        while seen:
            oldest, at = next(iter(seen.items()))
            if now - at <= self.window_s:
                break
            del seen[oldest]
        if nonce in seen:
            return False
        seen[nonce] = now
        return True

    def __len__(self) -> int:
        return len(self._seen)
