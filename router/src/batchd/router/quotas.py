"""Each tenant's quotas at each deployment: requests a second and tokens a minute, held across the
chart's router pods.

A token bucket per (deployment, tenant, quota), refilled at the quota's rate. Requests are taken
before the request is sent; tokens are charged after the answer, from the `usage` an OpenAI answer
reports (prompt plus completion, as the replica counts them), as Envoy AI Gateway does, so a
bucket may go into debt and the tenant's next requests wait until it is paid back.

Across routers: each router enforces its share, the quota divided by the routers that serve now
(`routers()`, the ready endpoints of the router's own Service). The Service spreads clients over
the routers, so the shares add up to the quota with no store between them, and a router that goes
away gives its share back within a watch event. A shared store (Redis) would be exact for a client
that sticks to one router, but adds a component to run, a round trip per request and a failure
mode (the store away: admit all, or none); uneven spreading costs at most one router's share here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from batchd.api.access import Tenant
from batchd.router.access import Refused
from batchd.router.directory import DeploymentRef
from batchd.router.errors import OverQuota

MINUTE_S = 60.0


class QuotaExceeded(Refused, OverQuota):
    """A tenant past a quota: 429 with Retry-After and OpenAI's x-ratelimit headers."""


class Bucket:
    """Tokens refilled at `rate_per_s` up to `capacity`; `level` may go below 0 (a debt)."""

    __slots__ = ("at", "capacity", "level", "rate_per_s")

    def __init__(self, rate_per_s: float, capacity: float, now: float) -> None:
        self.rate_per_s, self.capacity, self.level, self.at = rate_per_s, capacity, capacity, now

    def refill(self, now: float, rate_per_s: float, capacity: float) -> None:
        """Bring the level to `now`, at the rate that holds now (the routers' count may change)."""
        self.level = min(capacity, self.level + (now - self.at) * self.rate_per_s)
        self.rate_per_s, self.capacity, self.at = rate_per_s, capacity, now

    def wait_s(self, amount: float) -> float:
        """Seconds until `amount` may be taken (0: now)."""
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / self.rate_per_s

    def full_in_s(self) -> float:
        return max(0.0, self.capacity - self.level) / self.rate_per_s


@dataclass(frozen=True, slots=True)
class Limit:
    """One quota's state as OpenAI's headers say it: the quota (over all routers), what is left of
    it, and the seconds until it is whole again."""

    limit: float
    remaining: float
    reset_s: float


def rate_limit_headers(kind: str, limit: Limit) -> list[tuple[bytes, bytes]]:
    """`x-ratelimit-limit-{kind}`, `-remaining-{kind}`, `-reset-{kind}` (kind: requests, tokens)."""
    return [
        (b"x-ratelimit-limit-%b" % kind.encode(), b"%d" % math.floor(limit.limit)),
        (b"x-ratelimit-remaining-%b" % kind.encode(), b"%d" % max(0, math.floor(limit.remaining))),
        (b"x-ratelimit-reset-%b" % kind.encode(), f"{limit.reset_s:.3f}s".encode()),
    ]


class Quotas:
    """Every (deployment, tenant)'s buckets in this router, each at its share of the quota."""

    def __init__(
        self, routers: Callable[[], int] = lambda: 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._routers = routers
        self._clock = clock
        self._buckets: dict[tuple[DeploymentRef, str, str], Bucket] = {}

    def _bucket(
        self, ref: DeploymentRef, tenant: str, kind: str, rate_per_s: float, capacity: float
    ) -> Bucket:
        now = self._clock()
        key = (ref, tenant, kind)
        found = self._buckets.get(key)
        if found is None:
            found = self._buckets[key] = Bucket(rate_per_s, capacity, now)
        else:
            found.refill(now, rate_per_s, capacity)
        return found

    def _requests(self, ref: DeploymentRef, tenant: Tenant, routers: int) -> Bucket | None:
        if tenant.requests_per_s is None:
            return None
        share = tenant.requests_per_s / routers
        return self._bucket(ref, tenant.name, "requests", share, max(1.0, share))  # a second's burst

    def _tokens(self, ref: DeploymentRef, tenant: Tenant, routers: int) -> Bucket | None:
        if tenant.tokens_per_minute is None:
            return None
        share = tenant.tokens_per_minute / routers
        return self._bucket(ref, tenant.name, "tokens", share / MINUTE_S, share)  # a minute's worth

    def admit(self, ref: DeploymentRef, tenant: Tenant) -> None:
        """Take one request of `tenant`'s quota at `ref`; QuotaExceeded where it is spent, or its
        tokens are in debt."""
        if tenant.requests_per_s is None and tenant.tokens_per_minute is None:
            return  # most tenants: nothing to count, not even the routers
        routers = max(1, self._routers())
        requests, tokens = self._requests(ref, tenant, routers), self._tokens(ref, tenant, routers)
        if tokens is not None and tokens.level < 0:
            wait = tokens.wait_s(0)
            limit = Limit(tenant.tokens_per_minute or 0, tokens.level * routers, tokens.full_in_s())
            raise self._refused(ref, tenant, "tokens_per_minute", wait, rate_limit_headers("tokens", limit))
        if requests is not None:
            wait = requests.wait_s(1)
            if wait > 0:
                # What the routers can admit now: whole requests each, none where this one refuses.
                remaining = math.floor(requests.level) * routers
                limit = Limit(tenant.requests_per_s or 0, remaining, requests.full_in_s())
                headers = rate_limit_headers("requests", limit)
                raise self._refused(ref, tenant, "requests_per_s", wait, headers)
            requests.level -= 1

    def charge(self, ref: DeploymentRef, tenant: Tenant, tokens: int) -> None:
        """Charge the tokens an answer reports to `tenant`'s tokens-a-minute quota."""
        bucket = self._tokens(ref, tenant, max(1, self._routers()))
        if bucket is not None:
            bucket.level -= tokens

    @staticmethod
    def _refused(
        ref: DeploymentRef, tenant: Tenant, quota: str, wait_s: float, headers: list[tuple[bytes, bytes]]
    ) -> QuotaExceeded:
        error = QuotaExceeded(
            f"deployment {ref}: tenant {tenant.name!r} is past its {quota}", quota, tenant.name
        )
        error.headers = ((b"retry-after", b"%d" % max(1, math.ceil(wait_s))), *headers)
        return error


def tokens_used(body: bytes) -> int:
    """The tokens an OpenAI answer's `usage` reports (total, else prompt plus completion); 0 for an
    answer that reports none."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 0
    usage = document.get("usage") if isinstance(document, dict) else None
    if not isinstance(usage, dict):
        return 0
    total = usage.get("total_tokens")
    if isinstance(total, int) and total >= 0:
        return total
    parts = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
    return sum(part for part in parts if isinstance(part, int) and part > 0)
