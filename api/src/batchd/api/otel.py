"""The OpenTelemetry SDK as batchd's processes run it: imported only once tracing is configured
(`batchd.api.tracing`), by each component's one tracing module.

The SDK reads its own configuration from the standard environment: the sampler
(`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`), the resource (`OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`), the exporter's address (`OTEL_EXPORTER_OTLP_ENDPOINT`) and the batch
processor's bounds (`OTEL_BSP_*`). Spans leave in batches from the processor's own thread, so a
request never waits on the trace backend, and a backend that is down costs dropped spans, never
requests.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Sampler

__all__ = ["extract", "inject", "propagation_fields", "tracer_provider"]


def tracer_provider(
    default_service_name: str, processor: SpanProcessor | None = None, sampler: Sampler | None = None
) -> TracerProvider:
    """A provider whose resource is the environment's (`default_service_name` where it names no
    service), sampling as the environment says (or by `sampler`), exporting over OTLP/HTTP (or to
    `processor`: the tests' in-memory exporter)."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service_name}))
    provider = TracerProvider(resource=resource, sampler=sampler)
    provider.add_span_processor(processor or BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def propagation_fields() -> frozenset[bytes]:
    """The header names the configured propagators read (`traceparent`, `tracestate`, `baggage`
    by default; OTEL_PROPAGATORS may name others), lower-case bytes as ASGI servers hand them."""
    return frozenset(name.lower().encode("latin-1") for name in propagate.get_global_textmap().fields)


def extract(headers: Iterable[tuple[bytes, bytes]], fields: frozenset[bytes]) -> Context | None:
    """The caller's context from a request's headers (only `fields` are looked at); None when it
    sent none, so that a new trace starts."""
    carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in headers if name in fields}
    return propagate.extract(carrier) if carrier else None


def inject(context: Context) -> dict[str, str]:
    """The headers that carry `context` to the next hop."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return carrier
