"""Tracing in OpenTelemetry, as batchd's processes run it: the SDK's span processor and its OTLP
export. Imported only once tracing is configured (`batchd.api.tracing_config`), by the component's
own tracing module (`batchd.replica.tracing`, `batchd.router.tracing`): in every package,
`tracing` names the side that loads OpenTelemetry (here with `spans` and `otlp`, which it imports).

One span processor takes every span of the process: batchd's own (`batchd.api.spans`, recorded
as batchd decided) and those any other code makes through the global tracer provider (a
handler's own), which samples as the environment says (`OTEL_TRACES_SAMPLER`). The SDK reads the
resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), the exporter's address
(`OTEL_EXPORTER_OTLP_ENDPOINT`) and the batch processor's bounds (`OTEL_BSP_*`) from the standard
environment. Spans leave in batches from the processor's own thread (`batchd.api.otlp`), so a
request never waits on the trace backend, and a backend that is down costs dropped spans, never
requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from batchd.api import __version__
from batchd.api.otlp import SpanExporter
from batchd.api.spans import SpanWriter

__all__ = ["Pipeline", "pipeline"]


@dataclass(frozen=True)
class Pipeline:
    """Where a process's spans go: `processor`, with the process's `resource`; `provider` is the
    tracer provider of everyone else's spans (batchd sets it as the global one)."""

    processor: SpanProcessor
    resource: Resource
    provider: TracerProvider

    def writer(self, scope: str) -> SpanWriter:
        """What makes batchd's own spans, under the instrumentation scope `scope` (`batchd.replica`)."""
        return SpanWriter(self.processor, self.resource, InstrumentationScope(scope, __version__))

    def shutdown(self) -> None:
        """Send what is still buffered, and stop."""
        self.provider.shutdown()  # which shuts the processor down


def pipeline(default_service_name: str, processor: SpanProcessor | None = None) -> Pipeline:
    """The process's pipeline: its resource is the environment's (`default_service_name` where it
    names no service); spans go over OTLP/HTTP (or to `processor`: the tests' in-memory exporter)."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service_name}))
    processor = processor or BatchSpanProcessor(SpanExporter())
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(processor)
    return Pipeline(processor, resource, provider)
