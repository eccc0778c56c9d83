"""The router's spans, in OpenTelemetry: the one module of the router that imports it, loaded by
`cli` only when tracing is configured (`batchd.api.tracing`).

A SERVER span per routed request continues the caller's `traceparent` (never starts a trace
beside it), and carries what the router decided: the deployment and model, the time held while
the deployment had no ready replica, the revision a canary rollout drew, the replicas it chose
among, the one it chose, and every retry. The replica gets the router's own context in place of
the caller's, so that its span is the router span's child.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.semconv.attributes import error_attributes, http_attributes, url_attributes
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from batchd.api import __version__
from batchd.api.otel import extract, inject, propagation_fields

DEPLOYMENT = "batchd.deployment"  # namespace/name
MODEL = "batchd.model"
HELD_S = "batchd.router.held_s"  # time held while the deployment had no ready replica
REVISION = "batchd.router.revision"  # canary or stable, during a canary rollout
CANDIDATES = "batchd.router.candidates"  # the replicas the last pick chose among
REPLICA = "batchd.router.replica"  # the replica that answered (the last tried)
RETRIES = "batchd.router.retries"
RETRY_EVENT = "batchd.router.retry"


class RouterTracing:
    """`batchd.router.traces.Tracing`, with the OpenTelemetry SDK."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("batchd.router", __version__)
        self.propagation_headers = propagation_fields()

    def request_started(
        self, method: str, route: str, path: str, headers: list[tuple[bytes, bytes]]
    ) -> _RouteSpan:
        parent = extract(headers, self.propagation_headers)
        span = self._tracer.start_span(
            f"{method} {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                http_attributes.HTTP_REQUEST_METHOD: method,
                http_attributes.HTTP_ROUTE: route,
                url_attributes.URL_PATH: path,
            },
        )
        return _RouteSpan(span)

    def shutdown(self) -> None:
        self._provider.shutdown()


class _RouteSpan:
    __slots__ = ("_headers", "_retries", "recording", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.recording = span.is_recording()
        self._retries = 0
        self._headers: bytes | None = None

    def routed(self, namespace: str, name: str, model: str) -> None:
        if self.recording:
            self.span.set_attributes({DEPLOYMENT: f"{namespace}/{name}", MODEL: model})

    def held(self, seconds: float) -> None:
        if self.recording:
            self.span.set_attribute(HELD_S, seconds)

    def revision(self, canary: bool) -> None:
        if self.recording:
            self.span.set_attribute(REVISION, "canary" if canary else "stable")

    def picked(self, replica: str, candidates: Sequence[str]) -> None:
        if self.recording:
            self.span.set_attributes({REPLICA: replica, CANDIDATES: list(candidates)})

    def retried(self, replica: str, reason: str) -> None:
        self._retries += 1
        if self.recording:
            self.span.add_event(RETRY_EVENT, {REPLICA: replica, "batchd.router.reason": reason})

    def upstream_headers(self) -> bytes:
        if self._headers is None:  # the same for every attempt
            carrier = inject(trace.set_span_in_context(self.span))
            self._headers = b"".join(
                b"%b: %b\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items()
            )
        return self._headers

    def finished(self, status: int, error: BaseException | None) -> None:
        span = self.span
        if self.recording:
            attributes: dict[str, Any] = {
                http_attributes.HTTP_RESPONSE_STATUS_CODE: status,
                RETRIES: self._retries,
            }
            span.set_attributes(attributes)
            if error is not None:
                span.set_attribute(error_attributes.ERROR_TYPE, type(error).__qualname__)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR, str(error) if error is not None else None))
        span.end()
