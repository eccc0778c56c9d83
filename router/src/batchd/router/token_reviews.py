"""ServiceAccount tokens as credentials: TokenReview, then SubjectAccessReview, cached.

A caller in the cluster presents its pod's projected token, made for the audience `batchd`
(`TOKEN_AUDIENCE`). The API server says whose it is (TokenReview, with that audience, so a token
made for the API server or anything else is no credential here) and whether RBAC lets that
account invoke the BatchedDeployment it calls (SubjectAccessReview, verb `invoke`), as
kube-rbac-proxy checks. Both answers are cached by the token's digest and the deployment: an
allowed one up to `ALLOWED_TTL_S` and never past the token's own expiry, a refusal `REFUSED_TTL_S`
(a grant just made is seen soon). Identical reviews at once are one review (single flight), so a
burst of one caller's requests makes one pair of calls to the API server.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from batchd.api.access import key_digest
from batchd.api.kube_connection import ApiError
from batchd.api.pod import INVOKE_VERB, TOKEN_AUDIENCE
from batchd.api.spec import GROUP, PLURAL
from batchd.router.access import Forbidden, Unauthenticated
from batchd.router.directory import DeploymentRef
from batchd.router.errors import NotReady

logger = logging.getLogger(__name__)

ALLOWED_TTL_S = 300.0  # an allowed token, at most (and never past its expiry)
REFUSED_TTL_S = 10.0  # a refused one: a grant just made is seen within this
MAX_CACHED = 10_000  # reviews remembered, least recently used forgotten first
ACCOUNT_PREFIX = "system:serviceaccount:"
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@dataclass(frozen=True, slots=True)
class Review:
    """What the API server said of one token at one deployment: the account (`namespace/name`) it
    proves, whether it may invoke the deployment, why not (a metrics reason), and until when the
    token is good (wall clock, seconds; None: not said)."""

    account: str | None
    allowed: bool
    reason: str = ""
    expires_at: float | None = None


Reviewer = Callable[[bytes, DeploymentRef], Awaitable[Review]]


def expiry_of(token: bytes) -> float | None:
    """The `exp` a JWT's payload names (unverified: only to bound the cache; the API server checks
    the token itself); None where it names none."""
    try:
        payload = token.split(b".")[1]
        claims = orjson.loads(base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))
    except (IndexError, ValueError, binascii.Error, orjson.JSONDecodeError):
        return None
    found = claims.get("exp") if isinstance(claims, dict) else None
    return float(found) if isinstance(found, int | float) else None


class TokenReviews:
    """`access.Reviews`: each token's review at each deployment, cached and coalesced."""

    def __init__(
        self,
        reviewer: Reviewer,
        *,
        allowed_ttl_s: float = ALLOWED_TTL_S,
        refused_ttl_s: float = REFUSED_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._reviewer = reviewer
        self._allowed_ttl_s, self._refused_ttl_s = allowed_ttl_s, refused_ttl_s
        self._clock = clock
        self._cached: OrderedDict[tuple[bytes, DeploymentRef], tuple[float, Review]] = OrderedDict()
        self._flights: dict[tuple[bytes, DeploymentRef], asyncio.Future[Review]] = {}
        self.reviews = 0  # reviews asked of the reviewer, for tests and the benchmark

    async def account(self, token: bytes, ref: DeploymentRef) -> str:
        """The account of `token` where it may invoke `ref`; Unauthenticated (not a token of the
        audience) or Forbidden (RBAC does not grant it) otherwise."""
        review = await self.review(token, ref)
        if review.account is None:
            raise Unauthenticated(
                f"deployment {ref}: the token is refused ({review.reason})", "token_refused"
            )
        if not review.allowed:
            raise Forbidden(
                f"deployment {ref}: service account {review.account} may not {INVOKE_VERB} it", "not_invoker"
            )
        return review.account

    async def review(self, token: bytes, ref: DeploymentRef) -> Review:
        key = (key_digest(token), ref)
        now = self._clock()
        cached = self._cached.get(key)
        if cached is not None and cached[0] > now:
            self._cached.move_to_end(key)
            return cached[1]
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.ensure_future(self._review(key, token, ref))
            self._flights[key] = flight
            flight.add_done_callback(lambda _: self._flights.pop(key, None))
        # Shielded: a caller that leaves does not cancel the review others wait on.
        return await asyncio.shield(flight)

    async def _review(self, key: tuple[bytes, DeploymentRef], token: bytes, ref: DeploymentRef) -> Review:
        self.reviews += 1
        review = await self._reviewer(token, ref)  # an error is not cached: the next request asks again
        now = self._clock()
        if review.account is not None and review.allowed:
            until = now + self._allowed_ttl_s
            expires = review.expires_at if review.expires_at is not None else expiry_of(token)
            if expires is not None:
                until = min(until, expires)
        else:
            until = now + self._refused_ttl_s
        self._cached[key] = (until, review)
        self._cached.move_to_end(key)
        while len(self._cached) > MAX_CACHED:
            self._cached.popitem(last=False)
        return review


class Api(Protocol):
    async def call(
        self, method: str, path: str, *, body: Any = None, content_type: str | None = None
    ) -> Any: ...


def kube_reviewer(api: Api) -> Reviewer:
    """The reviews asked of the API server, through the router's own client (`kube_client`)."""

    async def review(token: bytes, ref: DeploymentRef) -> Review:
        try:
            return await _review(api, token, ref)
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            logger.warning("reviewing a token for %s: %s", ref, error)
            raise NotReady(f"deployment {ref}: the token could not be reviewed now") from None

    return review


async def _post(api: Api, path: str, document: dict[str, Any]) -> dict[str, Any]:
    response = await api.call("POST", path, body=document, content_type="application/json")
    answer: dict[str, Any] = orjson.loads(await response.read())
    return dict(answer.get("status") or {})


async def _review(api: Api, token: bytes, ref: DeploymentRef) -> Review:
    spec = {"token": token.decode("ascii", "replace"), "audiences": [TOKEN_AUDIENCE]}
    document = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
    status = await _post(api, TOKEN_REVIEWS, document)
    if not status.get("authenticated") or TOKEN_AUDIENCE not in (status.get("audiences") or []):
        return Review(None, False, "not a token of the audience batchd")
    user = status.get("user") or {}
    username = str(user.get("username") or "")
    if not username.startswith(ACCOUNT_PREFIX):
        return Review(None, False, "not a ServiceAccount's token")
    namespace, _, name = username.removeprefix(ACCOUNT_PREFIX).partition(":")
    account = f"{namespace}/{name}"
    attributes = {
        "group": GROUP,
        "resource": PLURAL,
        "verb": INVOKE_VERB,
        "namespace": ref.namespace,
        "name": ref.name,
    }
    access = {
        "user": username,
        "groups": list(user.get("groups") or []),
        "uid": str(user.get("uid") or ""),
        "extra": dict(user.get("extra") or {}),
        "resourceAttributes": attributes,
    }
    sar = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": access}
    allowed = bool((await _post(api, ACCESS_REVIEWS, sar)).get("allowed"))
    return Review(account, allowed, "" if allowed else f"RBAC grants no {INVOKE_VERB}")
