"""What both fronts answer, and how they count it: the ASGI front (`asgi`) and the direct path
(`direct`) answer the same request the same way, byte for byte, from these.

A request is in flight from its start to its answer (`Replica.inflight`, which the operator
reads), then counted once: a success, or the outcome and refusal its error's table entry says;
where the replica traces, its span starts with it and ends with its answer, and a recorded
request's trace id is the exemplar of the duration it is counted in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping
from typing import Any

import orjson

from batchd.api.headers import TIMEOUT_HEADER, parse_timeout_s
from batchd.api.stamp import request_target
from batchd.replica.errors import (
    ErrorAnswer,
    ErrorBodyMaker,
    HttpError,
    InvalidInput,
    answer_for,
    describe,
    http_error,
)
from batchd.replica.front.gate import ANONYMOUS, Caller, Gate
from batchd.replica.replica import Replica
from batchd.replica.traces import RequestTrace
from batchd.replica.waiting import NO_CLIENT, Abandoned, Client

logger = logging.getLogger(__name__)

JSON_HEADERS = [(b"content-type", b"application/json")]


def client_of(
    gate: Gate,
    scope: MutableMapping[str, Any],
    gone: Abandoned | None,
    trace: RequestTrace | None = None,
) -> Client:
    """The client of the ASGI request `scope`: who it is, as `gate` believes it (Unauthenticated,
    a 401, where it may not), how long it still waits, `gone` (see `client_waiting`) and its span."""
    headers = scope["headers"]
    caller = gate.caller(scope["method"], request_target(scope), headers)
    timeout = next((value for name, value in headers if name == TIMEOUT_HEADER), None)
    return client_waiting(timeout, gone, caller, trace)


def client_waiting(
    timeout: bytes | None,
    gone: Abandoned | None,
    caller: Caller = ANONYMOUS,
    trace: RequestTrace | None = None,
) -> Client:
    """A client that waits `timeout` seconds (the `batchd-timeout-s` value, None where it did not
    say), as `caller` (`gate`), its request traced by `trace`; InvalidInput (a 400) naming the
    header and the value when the timeout is no positive number."""
    if timeout is None and caller == ANONYMOUS and trace is None:
        return NO_CLIENT if gone is None else Client(gone)
    try:
        timeout_s = None if timeout is None else parse_timeout_s(timeout)
    except ValueError as error:
        raise InvalidInput(str(error)) from None
    return Client(
        gone,
        timeout_s,
        None if caller.priority is None else caller.priority.decode("latin-1"),
        "" if caller.caller is None else caller.caller.decode("latin-1"),
        tenant=caller.tenant,
        composed=caller.composed,
        trace=trace,
        queue_items=caller.queue_items,
    )


def opened(replica: Replica) -> float:
    """A request has started: it is in flight until `succeeded` or `failed`. Its start time."""
    replica.inflight += 1
    return time.perf_counter()


def succeeded(replica: Replica, started: float, trace: RequestTrace | None = None) -> None:
    replica.inflight -= 1
    if trace is None:
        replica.metrics.request_done("success", time.perf_counter() - started)
        return
    replica.metrics.request_done("success", time.perf_counter() - started, trace.exemplar)
    trace.finished(200, "success", None)


def failed(
    replica: Replica, error: BaseException, started: float, trace: RequestTrace | None = None
) -> ErrorAnswer:
    """Counts a request that failed (its outcome, and why it was refused where it was); its table entry."""
    replica.inflight -= 1
    answer = answer_for(error)
    replica.metrics.request_done(
        answer.outcome, time.perf_counter() - started, None if trace is None else trace.exemplar
    )
    if answer.rejection:
        replica.metrics.rejected(answer.rejection)
    if trace is not None:
        trace.finished(answer.status, answer.outcome, error)
    return answer


def dropped(replica: Replica, trace: RequestTrace | None = None) -> None:
    """The server cancelled a request (its task, at shutdown): out of flight, counted nowhere."""
    replica.inflight -= 1
    if trace is not None:
        trace.finished(499, "cancelled", None)


def error_answer(error: BaseException, body: ErrorBodyMaker) -> tuple[HttpError, bytes]:
    """The HTTP answer for a request that failed, and its body as JSON; a failure of the model is logged."""
    if answer_for(error).outcome == "error":
        logger.error("request failed: %s", describe(error))
    answer = http_error(error, body)
    return answer, orjson.dumps(answer.body)
