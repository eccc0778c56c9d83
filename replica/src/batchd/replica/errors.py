"""Every way a request can fail, and the one table that maps each to an HTTP answer.

KServe repeats this mapping in nine handlers; we keep it in one place so that the status code,
the `outcome` label on the metrics and the rejection reason can never disagree. The batcher,
the model layer and the protocols raise these; nothing here imports them.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from batchd.api.access import NotEntitled  # a class the tenant may not use: `batchd serve --api-keys`
from batchd.api.headers import REFUSED_HEADER


class QueueFull(Exception):
    """The queue cannot take the request's items; the client should retry later."""

    def __init__(self, requested: int, free: int, retry_after_s: float) -> None:
        super().__init__(f"queue full: {requested} item(s) asked for, {free} place(s) free")
        self.retry_after_s = retry_after_s


class Shed(QueueFull):
    """The request's class is sheddable and the queue is past the mark where such work is refused."""

    def __init__(self, priority_class: str, mark: int, retry_after_s: float) -> None:
        Exception.__init__(
            self,
            f"priority class {priority_class!r} is sheddable: refused while {mark} or more items are queued",
        )
        self.retry_after_s = retry_after_s


class Unauthenticated(Exception):
    """The request is not what batchd's router signed, at a deployment that serves only those
    (`front.gate`); the message says why, never the key or the signature."""


class TenantQueueFull(QueueFull):
    """The caller's tenant has its share of the queue waiting already (`spec.access` tenants'
    `queue_share`): one tenant cannot fill the queue while the others wait."""

    def __init__(self, tenant: str, share: int, retry_after_s: float) -> None:
        Exception.__init__(
            self,
            f"tenant {tenant!r} has its share of this replica's queue waiting ({share} items); retry later",
        )
        self.retry_after_s = retry_after_s


class QueueTimedOut(Exception):
    """The request waited its class's `queue_timeout_s` in the queue and was still there."""

    def __init__(self, priority_class: str, timeout_s: float, retry_after_s: float) -> None:
        super().__init__(
            f"priority class {priority_class!r}: still queued after its queue_timeout_s of {timeout_s:g} s; "
            "retry later"
        )
        self.retry_after_s = retry_after_s


class Displaced(Exception):
    """A request of a higher priority class took this queued request's place in a full queue."""

    def __init__(self, priority_class: str, by: str, retry_after_s: float) -> None:
        super().__init__(
            f"the queue was full and a request of priority class {by!r} took the place of this one "
            f"(class {priority_class!r}); retry later"
        )
        self.retry_after_s = retry_after_s


class Draining(Exception):
    """The replica is shutting down and admits no new work."""

    def __init__(self, message: str = "the replica is shutting down; retry on another replica") -> None:
        super().__init__(message)


class Stalled(Exception):
    """A batch has been in the model longer than any request may wait: new work would only wait too."""

    @classmethod
    def on(cls, work: str, seconds: float) -> Stalled:
        """The model has been on one `work` (a batch, a generation step) for `seconds`."""
        return cls(f"the model has been stuck on a {work} for {seconds:.0f} s; retry on another replica")


class DeadlineExceeded(Exception):
    """`request_timeout_s` passed before the request's results were ready."""

    @classmethod
    def passed(cls, deadline: str) -> DeadlineExceeded:
        """`deadline` (`request_timeout_s`, the client's `batchd-timeout-s`) came before the answer."""
        return cls(f"{deadline} passed before the model answered")


class ItemFailed(Exception):
    """The model raised on this item when it ran alone (a batch of one, or isolated from its
    batch-mates, who got their answers): the item, not the replica, is at fault (a 422)."""

    @classmethod
    def alone(cls, item: Any, error: BaseException) -> ItemFailed:
        shown = repr(item)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        return cls(f"the model fails on item {shown} alone: {type(error).__name__}: {error}")


class BatchSizeMismatch(ValueError):
    """The model returned a different number of results than it was given items."""


class InvalidInput(ValueError):
    """The request is malformed; the message names the field (its first word) and the value."""

    @property
    def param(self) -> str | None:
        """The field the message names (OpenAI's `param`)."""
        return field_named(str(self))


class UnknownPriorityClass(InvalidInput):
    """The request names a priority class its deployment does not have (the message, naming it and
    the classes there are, is `batchd.api.priority`'s, as the router's is)."""


class TooLarge(ValueError):
    """The request is larger than this replica accepts (body bytes or items)."""


class UnknownModel(LookupError):
    """The URL names a model this replica does not serve."""


class NotReady(RuntimeError):
    """The model is still loading or warming up."""

    @classmethod
    def loading(cls, model: str) -> NotReady:
        return cls(f"model {model!r} is still loading")


class ClientDisconnected(Exception):
    """The client went away before its answer was ready."""

    @classmethod
    def while_sending(cls) -> ClientDisconnected:
        return cls("the client went away while sending its request")

    @classmethod
    def before_answer(cls) -> ClientDisconnected:
        return cls("the client went away before its answer was ready")


class BatchWide(Exception):
    """A failure that says nothing about any one item of its batch: running the batch again in
    halves (`isolate_failures`) cannot find a culprit and would only repeat the calls."""


class CalleeError(Exception):
    """A deployment this one calls (`model.calls`) failed the call; the message names it."""

    def __init__(self, message: str, *, alias: str, deployment: str, status: int | None = None) -> None:
        super().__init__(message)
        self.alias = alias
        self.deployment = deployment
        self.status = status  # the callee's HTTP status, None when it never answered


class CalleeOverloaded(CalleeError, BatchWide):
    """The callee refused the call for now (503: queue full, loading, draining); retry later."""

    def __init__(self, message: str, *, alias: str, deployment: str, retry_after_s: float) -> None:
        super().__init__(message, alias=alias, deployment=deployment, status=503)
        self.retry_after_s = retry_after_s


class CalleeUnavailable(CalleeError, BatchWide):
    """Nothing answered at the callee's address (refused, reset, no endpoints); retry later."""


class CalleeTimeout(CalleeError, BatchWide):
    """The callee did not answer before the deadline of the requests the call was made for."""


@dataclass(frozen=True)
class ErrorAnswer:
    status: int
    outcome: str  # the `outcome` label of batchd_requests_total
    rejection: str | None = None  # the `reason` label of batchd_rejections_total, if refused up front
    retry: bool = False  # send Retry-After
    # Refused before the request was accepted: nothing of it reached the batcher, so another
    # replica may take it (the answer says `batchd-refused: <rejection>`, which a router retries).
    refused: bool = False


# The first entry whose class matches wins: order from specific to general.
ERROR_TABLE: tuple[tuple[type[BaseException], ErrorAnswer], ...] = (
    (InvalidInput, ErrorAnswer(400, "invalid", rejection="invalid")),
    (Unauthenticated, ErrorAnswer(401, "rejected", rejection="unauthenticated")),
    (NotEntitled, ErrorAnswer(403, "rejected", rejection="not_entitled")),
    (UnknownModel, ErrorAnswer(404, "invalid", rejection="invalid")),
    (TooLarge, ErrorAnswer(413, "rejected", rejection="too_large")),
    (ItemFailed, ErrorAnswer(422, "item_failed")),
    (Shed, ErrorAnswer(503, "rejected", rejection="shed", retry=True, refused=True)),
    # Another replica holds the tenant's share of its own queue: a router may try it.
    (TenantQueueFull, ErrorAnswer(503, "rejected", rejection="tenant_queue_full", retry=True, refused=True)),
    (QueueFull, ErrorAnswer(503, "rejected", rejection="queue_full", retry=True, refused=True)),
    # Accepted, then refused before the model: a router does not send it again (another item of
    # the request may have run), its client retries after Retry-After.
    (Displaced, ErrorAnswer(503, "rejected", rejection="displaced", retry=True)),
    (QueueTimedOut, ErrorAnswer(503, "rejected", rejection="queue_timeout", retry=True)),
    (Draining, ErrorAnswer(503, "rejected", rejection="draining", retry=True, refused=True)),
    (NotReady, ErrorAnswer(503, "rejected", rejection="not_ready", retry=True, refused=True)),
    (Stalled, ErrorAnswer(503, "rejected", rejection="stalled", retry=True, refused=True)),
    (DeadlineExceeded, ErrorAnswer(504, "timeout")),
    (ClientDisconnected, ErrorAnswer(499, "cancelled")),
    (asyncio.CancelledError, ErrorAnswer(499, "cancelled")),
    (BatchSizeMismatch, ErrorAnswer(500, "error")),
    # A callee's failure is passed on as the same kind of failure, its message naming the callee.
    # Never `refused`: the request was accepted (and its batch ran) before the callee failed.
    (CalleeOverloaded, ErrorAnswer(503, "rejected", retry=True)),
    (CalleeUnavailable, ErrorAnswer(503, "rejected", retry=True)),
    (CalleeTimeout, ErrorAnswer(504, "timeout")),
    (CalleeError, ErrorAnswer(500, "error")),
)
MODEL_ERROR = ErrorAnswer(500, "error")


def answer_for(error: BaseException) -> ErrorAnswer:
    for error_type, answer in ERROR_TABLE:
        if isinstance(error, error_type):
            return answer
    return MODEL_ERROR


def blamed_on(item: Any, error: Exception) -> Exception:
    """What a request gets when `item` failed alone with `error`: ItemFailed for an error of the
    model's own (one of ours, a callee's or a wrong number of results says nothing of the item)."""
    return ItemFailed.alone(item, error) if answer_for(error) is MODEL_ERROR else error


def describe(error: BaseException) -> str:
    """The message a client sees: ours verbatim, a model's exception with its type for context."""
    if answer_for(error) is MODEL_ERROR:
        return f"model error: {type(error).__name__}: {error}"
    return str(error) or type(error).__name__


@dataclass(frozen=True)
class HttpError:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: dict[str, Any]


def error_body(error: BaseException) -> dict[str, Any]:
    """batchd's own error body: `{"error": message}`."""
    return {"error": describe(error)}


# OpenAI's error `type` for each status of the table (its API reference and its client's
# exception classes); the `code` is the table's rejection reason or outcome.
_OPENAI_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}
# "field: ..." or "field[2].part: ...": the field a message names, as its first word.
_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]-]*): ")


def field_named(message: str) -> str | None:
    """The field an error message starts with ("max_tokens: 5000 is more than ..."), else None."""
    found = _FIELD.match(message)
    return found.group(1) if found else None


def openai_error_body(error: BaseException) -> dict[str, Any]:
    """OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`: the same message and
    status as `error_body`; `param` names the field of a malformed request."""
    answer = answer_for(error)
    message = describe(error)
    # A malformed request, one too large, or one for a model not served here names its field first.
    param = field_named(message) if answer.status in (400, 404, 413) else None
    return {
        "error": {
            "message": message,
            "type": _OPENAI_TYPES.get(answer.status, "server_error"),
            "param": param,
            "code": answer.rejection or answer.outcome,
        }
    }


ErrorBodyMaker = Callable[[BaseException], dict[str, Any]]


def http_error(error: BaseException, body: ErrorBodyMaker = error_body) -> HttpError:
    """The HTTP answer for an error: status, Retry-After where a retry makes sense, `batchd-refused`
    where the request was refused before it was accepted, and the body (`body` writes it)."""
    answer = answer_for(error)
    headers = [(b"content-type", b"application/json")]
    if answer.retry:
        retry_after = (
            error.retry_after_s
            if isinstance(error, (QueueFull, Displaced, QueueTimedOut, CalleeOverloaded))
            else 1.0
        )
        headers.append((b"retry-after", str(max(1, round(retry_after))).encode()))
    if answer.refused and answer.rejection is not None:
        headers.append((REFUSED_HEADER, answer.rejection.encode()))
    return HttpError(answer.status, headers, body(error))


class ErrorBody(BaseModel):
    """Every error answer: one message that names the field and the value, or the failure."""

    error: str


class OpenAIErrorDetail(BaseModel):
    message: str = Field(description="What failed; a malformed request's names the field and the value.")
    type: str = Field(description="invalid_request_error, not_found_error, service_unavailable_error, ...")
    param: str | None = Field(description="The field of the request that is wrong, where one is.")
    code: str | None = Field(description="batchd's reason: invalid, too_large, queue_full, draining, ...")


class OpenAIErrorBody(BaseModel):
    """Every error answer of the OpenAI routes, in OpenAI's shape."""

    error: OpenAIErrorDetail


# What each status means, for the OpenAPI document (499 is for the log: its client is gone).
_MEANINGS: dict[int, str] = {
    400: "The request is malformed; the message names the field and the value.",
    401: "The request is not signed by batchd's router (or its stamp is stale or used before), at a "
    "deployment that serves only requests through the router: call the router, with a credential "
    "(or, where the replica takes API keys itself, with one of them).",
    403: "The caller's tenant may not use the priority class it asks for (a replica that takes API "
    "keys itself, `batchd serve --api-keys`): the message names the classes it may use.",
    404: "The URL names a model this replica does not serve.",
    413: "The body or the number of items is larger than this replica accepts.",
    422: "The model raised on an item of this request when it ran alone: the message names the "
    "item and the model's error. Its batch-mates got their answers.",
    500: "The model raised on a batch that no single item explains, or answered with the wrong "
    "number of results, or a deployment it calls failed (the message names it).",
    503: "The queue is full (or the caller's tenant has its share of it waiting, or a higher "
    "priority class took the request's place, or it waited its class's queue_timeout_s), the "
    "model is still loading or stuck on a batch, or the replica is "
    "shutting down, or a deployment it calls is overloaded or unreachable: retry after Retry-After "
    "seconds (on another replica).",
    504: "request_timeout_s passed before the model (or a deployment it calls) answered.",
}


def endpoint_statuses(*, names_model: bool) -> tuple[int, ...]:
    """The error statuses an inference route can answer, from the table: all of them but 499
    (its client is gone) and, where the path names no model, 404."""
    statuses = {answer.status for _, answer in ERROR_TABLE} | {MODEL_ERROR.status}
    statuses.discard(499)
    if not names_model:
        statuses.discard(404)
    return tuple(sorted(statuses))


def openapi_responses(*statuses: int, schema: type[BaseModel] = ErrorBody) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route for these error statuses, from the same table."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        response: dict[str, Any] = {"model": schema, "description": _MEANINGS[status]}
        if any(answer.status == status and answer.retry for _, answer in ERROR_TABLE):
            retry_after = {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
            response["headers"] = {"Retry-After": retry_after}
        responses[status] = response
    return responses
