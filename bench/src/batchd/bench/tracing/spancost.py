"""What batchd's own span code saves against the OpenTelemetry SDK's, per span, in this process:
the CPU of a request's two spans (its SERVER span, and its batch's linked to it) through the SDK's
Tracer and through `batchd.api.spans`, and of encoding spans to OTLP's protobuf through the SDK's
encoder and through `batchd.api.otlp`. The spans carry the attributes the replica sets."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, set_span_in_context

from batchd.api.otlp import encode_spans as own_encode
from batchd.api.spans import SpanWriter
from batchd.api.tracecontext import HeadSampler
from batchd.bench.tracing.analysis import SpanCost

SCOPE = "batchd.replica"
ENCODED_PER_EXPORT = 512  # the batch span processor's default batch (OTEL_BSP_MAX_EXPORT_BATCH_SIZE)


class _Kept(SpanProcessor):
    """Keeps every ended span, so that the encoders have real ones to encode."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def _request_attributes() -> dict[str, Any]:
    return {
        "http.request.method": "POST",
        "http.route": "/v1/models/{name}:predict",
        "url.path": "/v1/models/adder:predict",
        "gen_ai.operation.name": "predict",
        "gen_ai.request.model": "adder",
        "batchd.deployment": "adder",
    }


def _batch_attributes() -> dict[str, Any]:
    return {
        "batchd.deployment": "adder",
        "batchd.batch.size": 1,
        "batchd.batch.requests": 1,
        "batchd.batch.wait_s": 1e-3,
    }


def _cpu_us_each(work: Callable[[], object], times: int) -> float:
    began = time.process_time()
    for _ in range(times):
        work()
    return (time.process_time() - began) / times * 1e6


def span_cost(requests: int, rounds: int) -> SpanCost:
    """Each way, `rounds` times: `requests` requests' spans made, then encoded per export batch."""
    resource = Resource.create({"service.name": "bench"})
    kept = _Kept()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(kept)
    tracer = provider.get_tracer(SCOPE)
    writer = SpanWriter(kept, resource, InstrumentationScope(SCOPE))
    sampler = HeadSampler(1.0)

    def through_sdk() -> None:
        request = tracer.start_span("POST predict", kind=SpanKind.SERVER, attributes=_request_attributes())
        request.set_attribute("batchd.priority_class", "default")
        request.set_attribute("batchd.queue_s", 1e-3)
        request.set_attributes({"http.response.status_code": 200, "batchd.outcome": "ok"})
        request.end()
        batch = tracer.start_span(
            "batch adder",
            context=set_span_in_context(request),
            links=[Link(request.get_span_context())],
            attributes=_batch_attributes(),
        )
        batch.set_attribute("batchd.batch.model_s", 1e-4)
        batch.end()

    def own() -> None:
        trace_id = sampler.decide(None)
        request = writer.start("POST predict", trace_id, None, SpanKind.SERVER, _request_attributes())
        request.attributes["batchd.priority_class"] = "default"
        request.attributes["batchd.queue_s"] = 1e-3
        request.attributes["http.response.status_code"] = 200
        request.attributes["batchd.outcome"] = "ok"
        request.end()
        batch = writer.start(
            "batch adder", trace_id, request.context, attributes=_batch_attributes(), links=[request.context]
        )
        batch.attributes["batchd.batch.model_s"] = 1e-4
        batch.end()

    cost = SpanCost([], [], [], [])
    exports = max(1, 2 * requests // ENCODED_PER_EXPORT)
    for _ in range(rounds):
        kept.spans.clear()
        cost.sdk_request_us.append(_cpu_us_each(through_sdk, requests))
        sdk_spans = kept.spans[:ENCODED_PER_EXPORT]
        kept.spans = []
        cost.own_request_us.append(_cpu_us_each(own, requests))
        own_spans = kept.spans[:ENCODED_PER_EXPORT]
        kept.spans = []
        sdk_us = _cpu_us_each(lambda: sdk_encode(sdk_spans).SerializeToString(), exports)  # noqa: B023
        own_us = _cpu_us_each(lambda: own_encode(own_spans), exports)  # noqa: B023
        cost.sdk_encode_us.append(sdk_us / len(sdk_spans))
        cost.own_encode_us.append(own_us / len(own_spans))
    provider.shutdown()
    return cost
