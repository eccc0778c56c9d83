"""The router's spans, in OpenTelemetry: the one module of the router that imports it, loaded by
`cli` only when tracing is configured (`batchd.api.tracing_config`).

Whether a request is recorded is decided first, from its headers alone (`batchd.api.tracecontext`),
and passed on: a request the router does not record costs it a header scan and a random draw.
A caller's sampled flag decides only where its tenant trusts traces (`trust_traces`; every caller
of an open deployment): any other caller's trace is recorded by the ratio on its trace id, so a
client can neither force a recording nor hide from one. Where the two ways disagree, the span is
started and kept or dropped once the caller is known. A request the router does not record goes
on with its caller's trace, if any, or a new one, with the flag off, so that the replica records
nothing of it either.

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

from batchd.api.spans import OwnSpan, context_headers, remote_context
from batchd.api.tracecontext import (
    TRACEPARENT,
    TRACESTATE,
    HeadSampler,
    TraceParent,
    caller_of,
    unrecorded_headers,
)
from batchd.api.tracing import Pipeline

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
    ) -> _RouteSpan | _Unrecorded:
        parent = caller_of(headers)
        untrusted = self._sampler.decide(parent, trusted=False)
        trusted = self._sampler.decide(parent) if parent is not None else untrusted
        if not untrusted and not trusted:
            return _Unrecorded(parent) if parent is not None else UNRECORDED
        attributes = {
            http_attributes.HTTP_REQUEST_METHOD: method,
            http_attributes.HTTP_ROUTE: route,
            url_attributes.URL_PATH: path,
        }
        context = None if parent is None else remote_context(parent)
        name = f"{method} {route}"
        span = self._spans.start(name, untrusted or trusted, context, SpanKind.SERVER, attributes)
        # None: recorded whoever calls; else whether a trusted caller's request is.
        return _RouteSpan(span, parent, None if bool(untrusted) == bool(trusted) else bool(trusted))

    def shutdown(self) -> None:
        self._pipeline.shutdown()


class _RouteSpan:
    __slots__ = ("_dropped", "_headers", "_keep_if_trusted", "_parent", "_retries", "span")

    def __init__(self, span: OwnSpan, parent: TraceParent | None, keep_if_trusted: bool | None) -> None:
        self.span = span
        self._parent = parent
        self._keep_if_trusted = keep_if_trusted  # None: settled
        self._dropped = False  # settled as not recorded: the span never ends, so it is never sent
        self._retries = 0
        self._headers: bytes | None = None

    def caller_trusted(self, trusted: bool) -> None:
        if self._keep_if_trusted is not None:
            self._dropped = self._keep_if_trusted is not trusted
            self._keep_if_trusted = None

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
        self.caller_trusted(False)  # no-op once the caller is known
        if self._dropped:
            return unrecorded_headers(self._parent)
        if self._headers is None:  # the same for every attempt
            headers = context_headers(self.span.context).items()
            self._headers = "".join(f"{name}: {value}\r\n" for name, value in headers).encode("latin-1")
        return self._headers

    def finished(self, status: int, error: BaseException | None) -> None:
        self.caller_trusted(False)
        if self._dropped:
            return
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
    """A request the router does not record: nothing to note, and the replica is told so, in the
    caller's trace where it came with one."""

    __slots__ = ("_parent",)

    def __init__(self, parent: TraceParent | None = None) -> None:
        self._parent = parent

    def caller_trusted(self, trusted: bool) -> None:
        pass

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
        return unrecorded_headers(self._parent)

    def finished(self, status: int, error: BaseException | None) -> None:
        pass


UNRECORDED = _Unrecorded()
