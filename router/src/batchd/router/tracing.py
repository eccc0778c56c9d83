"""The router's spans, in OpenTelemetry: the one module of the router that imports it, loaded by
`cli` only when tracing is configured (`batchd.api.tracing`).

Whether a request is recorded is decided first, from its headers alone (`batchd.api.tracecontext`),
and passed on: a request the router does not record costs it a header scan and a random draw.
One that arrived with a `traceparent` goes on with it, its sampled flag as the caller set it; one
that arrived with none gets a `traceparent` with the flag off, so that the replica records nothing
of it either.

A SERVER span per recorded request continues the caller's `traceparent` (never starts a trace
beside it), and carries what the router decided: the deployment and model, the time held while
the deployment had no ready replica, the revision a canary rollout drew, the replicas it chose
among, the one it chose, and every retry. The replica gets the router's own context in place of
the caller's, so that its span is the router span's child.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.semconv.attributes import error_attributes, http_attributes, url_attributes
from opentelemetry.trace import SpanKind

from batchd.api.otel import Pipeline
from batchd.api.spans import OwnSpan, context_headers, remote_context
from batchd.api.tracecontext import (
    TRACEPARENT,
    TRACESTATE,
    HeadSampler,
    caller_of,
    unrecorded_traceparent,
)

DEPLOYMENT = "batchd.deployment"  # namespace/name
MODEL = "batchd.model"
HELD_S = "batchd.router.held_s"  # time held while the deployment had no ready replica
REVISION = "batchd.router.revision"  # canary or stable, during a canary rollout
CANDIDATES = "batchd.router.candidates"  # the replicas the last pick chose among
REPLICA = "batchd.router.replica"  # the replica that answered (the last tried)
RETRIES = "batchd.router.retries"
RETRY_EVENT = "batchd.router.retry"
REASON = "batchd.router.reason"


class RouterTracing:
    """`batchd.router.traces.Tracing`, in OpenTelemetry: only the requests it records get a span."""

    propagation_headers = frozenset({TRACEPARENT, TRACESTATE})

    def __init__(self, pipeline: Pipeline, sampler: HeadSampler) -> None:
        self._pipeline = pipeline
        self._spans = pipeline.writer("batchd.router")
        self._sampler = sampler

    def request_started(
        self, method: str, route: str, path: str, headers: list[tuple[bytes, bytes]]
    ) -> _RouteSpan | _Unrecorded | None:
        parent = caller_of(headers)
        trace_id = self._sampler.decide(parent)
        if not trace_id:
            # Not recorded: a caller's context goes on as it came; without one, the replica is told.
            return None if parent is not None else UNRECORDED
        attributes = {
            http_attributes.HTTP_REQUEST_METHOD: method,
            http_attributes.HTTP_ROUTE: route,
            url_attributes.URL_PATH: path,
        }
        context = None if parent is None else remote_context(parent)
        return _RouteSpan(
            self._spans.start(f"{method} {route}", trace_id, context, SpanKind.SERVER, attributes)
        )

    def shutdown(self) -> None:
        self._pipeline.shutdown()


class _RouteSpan:
    __slots__ = ("_headers", "_retries", "span")

    def __init__(self, span: OwnSpan) -> None:
        self.span = span
        self._retries = 0
        self._headers: bytes | None = None

    def routed(self, namespace: str, name: str, model: str) -> None:
        self.span.attributes[DEPLOYMENT] = f"{namespace}/{name}"
        self.span.attributes[MODEL] = model

    def held(self, seconds: float) -> None:
        self.span.attributes[HELD_S] = seconds

    def revision(self, canary: bool) -> None:
        self.span.attributes[REVISION] = "canary" if canary else "stable"

    def picked(self, replica: str, candidates: Sequence[str]) -> None:
        self.span.attributes[REPLICA] = replica
        self.span.attributes[CANDIDATES] = tuple(candidates)

    def retried(self, replica: str, reason: str) -> None:
        self._retries += 1
        self.span.add_event(RETRY_EVENT, {REPLICA: replica, REASON: reason})

    def upstream_headers(self) -> bytes:
        if self._headers is None:  # the same for every attempt
            headers = context_headers(self.span.context).items()
            self._headers = "".join(f"{name}: {value}\r\n" for name, value in headers).encode("latin-1")
        return self._headers

    def finished(self, status: int, error: BaseException | None) -> None:
        span = self.span
        attributes: dict[str, Any] = span.attributes
        attributes[http_attributes.HTTP_RESPONSE_STATUS_CODE] = status
        attributes[RETRIES] = self._retries
        if error is not None:
            attributes[error_attributes.ERROR_TYPE] = type(error).__qualname__
        if status >= 500:
            span.fail(str(error) if error is not None else None)
        span.end()


class _Unrecorded:
    """A new trace the router does not record: nothing to note, and the replica is told so."""

    __slots__ = ()

    def routed(self, namespace: str, name: str, model: str) -> None:
        pass

    def held(self, seconds: float) -> None:
        pass

    def revision(self, canary: bool) -> None:
        pass

    def picked(self, replica: str, candidates: Sequence[str]) -> None:
        pass

    def retried(self, replica: str, reason: str) -> None:
        pass

    def upstream_headers(self) -> bytes:
        return b"traceparent: %b\r\n" % unrecorded_traceparent()

    def finished(self, status: int, error: BaseException | None) -> None:
        pass


UNRECORDED = _Unrecorded()
