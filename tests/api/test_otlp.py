"""batchd's OTLP encoding of spans reads back, through protobuf's own parser, as the very message
the SDK's encoder makes of the same spans: every field a span, an event, a link, a status, a
resource and a scope can carry."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)
from opentelemetry.util.types import AttributeValue

from batchd.api.otlp import encode_spans

REMOTE = SpanContext(
    0x4BF92F3577B34DA6A3CE929D0E0E4736,
    0x00F067AA0BA902B7,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
    trace_state=TraceState([("vendor", "value"), ("other", "x")]),
)


def spans() -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    resources = [
        Resource({"service.name": "one", "k8s.pod.name": "pod-0", "count": 3}, "https://schema/1"),
        Resource({"service.name": "two"}),
    ]
    for resource in resources:
        provider = TracerProvider(resource=resource, span_limits=SpanLimits(max_links=2, max_events=2))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("batchd.test", "1.2.3", schema_url="https://schema/scope")
        bare = provider.get_tracer("bare")
        attributes: dict[str, AttributeValue] = {
            "text": "café",
            "empty": "",
            "int": 7,
            "negative": -12,
            "zero": 0,
            "big": 2**62,
            "float": 0.25,
            "true": True,
            "false": False,
            "strings": ("a", "b"),
            "numbers": (1.5, -2.5),
        }
        root = tracer.start_span(
            "request", context=set_span_in_context(NonRecordingSpan(REMOTE)), kind=SpanKind.SERVER
        )
        root.set_attributes(attributes)
        root.add_event("retry", {"replica": "10.0.0.1:8000", "n": 2})
        root.add_event("bare")
        root.add_event("dropped, over the limit of two")
        local = root.get_span_context()
        child = tracer.start_span(
            "batch",
            context=set_span_in_context(root),
            links=[Link(REMOTE, {"why": "carried"}), Link(local), Link(REMOTE)],
        )
        child.set_status(Status(StatusCode.ERROR, "the model failed"))
        child.end()
        root.set_status(Status(StatusCode.OK))
        root.end()
        for kind in SpanKind:
            bare.start_span(f"kind {kind.name}", kind=kind).end()
    return list(exporter.get_finished_spans())


def test_the_encoding_is_the_sdks() -> None:
    finished = spans()
    ours = ExportTraceServiceRequest.FromString(encode_spans(finished))
    assert ours == sdk_encode_spans(finished)
    assert len(ours.resource_spans) == 2
    assert [len(scoped.spans) for scoped in ours.resource_spans[0].scope_spans] == [2, 5]


def test_one_span_at_a_time_too() -> None:
    for span in spans():
        assert ExportTraceServiceRequest.FromString(encode_spans([span])) == sdk_encode_spans([span])


def test_no_spans_is_an_empty_request() -> None:
    assert encode_spans([]) == b""
