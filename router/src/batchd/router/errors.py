"""Every answer the router gives of its own, and the one table that maps each to HTTP.

Answers a replica gives pass through untouched; these are the router's: no route, no such model,
nowhere to send the request, or a replica that failed after it had accepted the request. The body
has the replica's shape (`{"error": message}`) so that a client reads both the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from batchd.router.settings import RouterSettings


class RouterError(Exception):
    """A request the router answers itself; the message names the model or the route."""

    headers: tuple[tuple[bytes, bytes], ...] = ()  # sent with the answer (WWW-Authenticate, ...)


class BadRequest(RouterError):
    """Something the router reads of the request is malformed; the message names it and the value."""


class DeadlineExceeded(RouterError):
    """The time the client gave the request (`batchd-timeout-s`) passed before it could be sent, or
    a replica did not answer within its deployment's `request_timeout_s` (plus a margin)."""


class NoRoute(RouterError):
    """The path is none of the inference routes the router forwards."""


class UnknownModel(RouterError):
    """No BatchedDeployment serves the model named in the request (or it was deleted)."""


class AmbiguousModel(RouterError):
    """More than one BatchedDeployment serves the model name: the router will not guess."""


class NotSynced(RouterError):
    """The router has not yet read the deployments and endpoints from the API server."""


class HoldRefused(RouterError):
    """The deployment has no ready replica and the router holds no more requests for it, or this
    one waited as long as it may: the client retries after Retry-After."""


class HoldTimedOut(HoldRefused):
    """A held request waited the time it was given and no replica became ready."""


class HoldDisplaced(HoldRefused):
    """The hold was full and a request of a higher priority class took this one's place."""


class Unreachable(RouterError):
    """No replica could be reached; nothing was sent, so the client may retry."""


class UpstreamFailed(RouterError):
    """The replica failed after the request was written to it: it may have been computed, so it
    is not sent again."""


class Unauthorized(RouterError):
    """The caller is not known: no credential, or one that is nobody's (401)."""


class NotAllowed(RouterError):
    """The caller is known and may not do what it asks (403)."""


class OverQuota(RouterError):
    """The caller's tenant is past its quota (429, with Retry-After and x-ratelimit headers)."""


class NotReady(RouterError):
    """Something the router needs for this deployment is not read yet (503, with Retry-After)."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    retry: bool = False  # send Retry-After


# The first entry whose class matches wins: order from specific to general.
ERROR_TABLE: tuple[tuple[type[RouterError], Answer], ...] = (
    (BadRequest, Answer(400)),
    (Unauthorized, Answer(401)),
    (NotAllowed, Answer(403)),
    (OverQuota, Answer(429)),
    (NotReady, Answer(503, retry=True)),
    (NoRoute, Answer(404)),
    (UnknownModel, Answer(404)),
    (AmbiguousModel, Answer(409)),
    (NotSynced, Answer(503, retry=True)),
    (HoldRefused, Answer(503, retry=True)),
    (Unreachable, Answer(503, retry=True)),
    (UpstreamFailed, Answer(502)),
    (DeadlineExceeded, Answer(504)),
)


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


def http_answer(error: RouterError, settings: RouterSettings) -> HttpAnswer:
    answer = next((answer for kind, answer in ERROR_TABLE if isinstance(error, kind)), Answer(500))
    headers = [(b"content-type", b"application/json")]
    if answer.retry:
        headers.append((b"retry-after", str(settings.hold_retry_after_s).encode()))
    headers.extend(error.headers)
    return HttpAnswer(answer.status, headers, orjson.dumps({"error": str(error)}))
