"""batchd's own spans: written straight to the SDK's span processor, without its Tracer.

A span the SDK's Tracer makes runs its sampler, takes a lock per change, and checks every
attribute's value against the span limits (its sequence-or-not test is an ABC check): about 20
microseconds for a request's span of eight attributes, as much as the replica spends on the
whole request of a trivial model. batchd knows when it starts a span that the span is recorded
(it decided, `batchd.api.tracecontext`), and sets only attributes of its own, of plain types;
so its spans are plain records until they end, and then become the SDK's `ReadableSpan`s, which
the same processor and exporter as every other span's batch and send. What a handler's own code
traces goes through the SDK's Tracer as usual, nested under the current batch.

Own code, because the SDK's Tracer misses the 100%-sampling goal (0.95x the requests per second of
tracing off): measured on this project's 2-core machine (`python -m batchd.bench.tracing`, its span part,
`bench/results/tracing.md`), a request's two spans (its SERVER span and its batch's, linked) took
92-125 us of CPU through the SDK's Tracer and 22-27 us here, where the trivial adder's whole
request costs the replica about 80-100 us with tracing off.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from batchd.api.tracecontext import TraceParent, traceparent

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
UNSET = Status(StatusCode.UNSET)


def new_span_id() -> int:
    return random.getrandbits(64) or 1


def new_trace_id() -> int:
    return random.getrandbits(128) or 1


def remote_context(parent: TraceParent) -> SpanContext:
    """The caller's span, as the SDK names a remote parent."""
    state = TraceState.from_header([parent.state.decode("latin-1")]) if parent.state else None
    flags = SAMPLED if parent.sampled else TraceFlags(0)
    return SpanContext(parent.trace_id, parent.span_id, True, flags, state)


def context_headers(context: SpanContext) -> dict[str, str]:
    """The `traceparent` (and `tracestate`) that carry a recorded span's context to the next hop."""
    headers = {"traceparent": traceparent(context.trace_id, context.span_id, True).decode()}
    if context.trace_state:
        headers["tracestate"] = context.trace_state.to_header()
    return headers


class SpanWriter:
    """Makes the spans of one instrumentation scope (`batchd.replica`, `batchd.router`) and hands
    them, ended, to `processor`."""

    def __init__(self, processor: SpanProcessor, resource: Resource, scope: InstrumentationScope) -> None:
        self.processor = processor
        self.resource = resource
        self.scope = scope
        self.max_links = SpanLimits().max_links or 0  # OTEL_SPAN_LINK_COUNT_LIMIT (128 by default)

    def start(
        self,
        name: str,
        trace_id: int,
        parent: SpanContext | None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: dict[str, Any] | None = None,
        links: Sequence[SpanContext] = (),
    ) -> OwnSpan:
        """A recorded span of the trace `trace_id`, a child of `parent` (None: the trace's root)."""
        return OwnSpan(self, name, trace_id, parent, kind, attributes, links)


class OwnSpan:
    """A recorded span until it ends: its ids, times, attributes, links and events as plain values."""

    __slots__ = (
        "attributes",
        "context",
        "events",
        "kind",
        "links",
        "name",
        "parent",
        "start_ns",
        "status",
        "writer",
    )

    def __init__(
        self,
        writer: SpanWriter,
        name: str,
        trace_id: int,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any] | None,
        links: Sequence[SpanContext],
    ) -> None:
        self.writer = writer
        self.name = name
        state = parent.trace_state if parent is not None else None
        self.context = SpanContext(trace_id, new_span_id(), False, SAMPLED, state)
        self.parent = parent
        self.kind = kind
        self.attributes: dict[str, Any] = attributes if attributes is not None else {}
        self.links = links
        self.events: list[Event] = []
        self.status = UNSET
        self.start_ns = time.time_ns()

    @property
    def trace_id(self) -> int:
        return self.context.trace_id

    def add_event(self, name: str, attributes: dict[str, Any]) -> None:
        self.events.append(Event(name, attributes, time.time_ns()))

    def fail(self, description: str | None) -> None:
        self.status = Status(StatusCode.ERROR, description)

    def end(self) -> None:
        writer = self.writer
        links: Sequence[Link] = ()
        if self.links:
            links = BoundedList.from_seq(writer.max_links, [Link(context) for context in self.links])
        span = ReadableSpan(
            self.name,
            self.context,
            self.parent,
            writer.resource,
            self.attributes,
            self.events,
            links,
            self.kind,
            None,
            self.status,
            self.start_ns,
            time.time_ns(),
            writer.scope,
        )
        writer.processor.on_end(span)
