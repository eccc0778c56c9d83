"""Tracing's configuration, as every batchd process reads it: the standard OpenTelemetry environment.

The operator renders a deployment's `spec.tracing` into these variables on its replica pods, with
the pod's Kubernetes resource attributes (as KServe and the OpenTelemetry Operator inject them);
the chart renders its `tracing` values the same way into the operator's and the router's pods; and
`batchd serve` applies a local manifest's `spec.tracing` the same way. Each process then reads them
once at start-up (`TracingConfig.from_environ`): with an OTLP endpoint it loads its component's
tracing module, the one module that imports OpenTelemetry, and passes it down; without one it
imports no OpenTelemetry code at all. The sampler is read here, as the SDK would read it, because
batchd decides which requests it records before it builds anything for them
(`batchd.api.tracecontext`); the SDK reads the resource and the exporter's address itself
(`batchd.api.tracing`).

No OpenTelemetry import here: this module runs whether tracing is on or off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from batchd.api.spec import TracingSpec
from batchd.api.tracecontext import HeadSampler

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
SAMPLER = "OTEL_TRACES_SAMPLER"
SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
SERVICE_NAME = "OTEL_SERVICE_NAME"
RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
SDK_DISABLED = "OTEL_SDK_DISABLED"
# The GenAI instrumentations' opt-in for prompt and completion text in telemetry.
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

# Parent-based: a request that arrives with a `traceparent` keeps its caller's decision, so a trace
# is recorded whole or not at all; a new trace is recorded with the ratio's chance.
SAMPLER_NAME = "parentbased_traceidratio"

# The pod's own facts, from the downward API, under the OpenTelemetry Operator's names; the
# resource attributes refer to them as $(NAME), which the kubelet expands.
POD_FIELDS = (
    ("OTEL_RESOURCE_ATTRIBUTES_POD_NAME", "metadata.name", "k8s.pod.name"),
    ("OTEL_RESOURCE_ATTRIBUTES_POD_UID", "metadata.uid", "k8s.pod.uid"),
    ("OTEL_RESOURCE_ATTRIBUTES_NAMESPACE", "metadata.namespace", "k8s.namespace.name"),
    ("OTEL_RESOURCE_ATTRIBUTES_NODE_NAME", "spec.nodeName", "k8s.node.name"),
)


def environment(tracing: TracingSpec, service_name: str) -> dict[str, str]:
    """The OpenTelemetry variables `tracing` sets for a process named `service_name` (unless the
    block names its own), in the order a pod's env lists them."""
    return {
        SERVICE_NAME: tracing.service_name or service_name,
        ENDPOINT: tracing.endpoint.rstrip("/"),
        PROTOCOL: "http/protobuf",
        TRACES_EXPORTER: "otlp",
        SAMPLER: SAMPLER_NAME,
        SAMPLER_ARG: format(tracing.sampling_ratio, "g"),
        CAPTURE_CONTENT: "true" if tracing.capture_prompts else "false",
    }


def pod_environment(
    tracing: TracingSpec, service_name: str, resource: Mapping[str, str]
) -> list[dict[str, Any]]:
    """A pod's env entries for `tracing`: the variables of `environment`, the pod's own facts from
    the downward API, and `OTEL_RESOURCE_ATTRIBUTES` naming them (`k8s.pod.name`, ...) beside
    `resource` (the attributes the caller knows: its Deployment, container, version)."""
    entries: list[dict[str, Any]] = [
        {"name": name, "value": value} for name, value in environment(tracing, service_name).items()
    ]
    entries += [
        {"name": variable, "valueFrom": {"fieldRef": {"fieldPath": field}}}
        for variable, field, _ in POD_FIELDS
    ]
    attributes = [f"{attribute}=$({variable})" for variable, _, attribute in POD_FIELDS]
    attributes += [f"{key}={value}" for key, value in resource.items()]
    entries.append({"name": RESOURCE_ATTRIBUTES, "value": ",".join(attributes)})
    return entries


# The SDK's built-in samplers by their OTEL_TRACES_SAMPLER names: (parent-based, ratio from the
# argument, ratio otherwise). The SDK takes any other name for its default, as `sampler_of` does.
DEFAULT_SAMPLER = "parentbased_always_on"
SAMPLERS = {
    "always_on": (False, False, 1.0),
    "always_off": (False, False, 0.0),
    "traceidratio": (False, True, 1.0),
    "parentbased_always_on": (True, False, 1.0),
    "parentbased_always_off": (True, False, 0.0),
    "parentbased_traceidratio": (True, True, 1.0),
}


def sampler_of(environ: Mapping[str, str]) -> HeadSampler:
    """The sampler OTEL_TRACES_SAMPLER and its argument name, read as the SDK reads them (an
    unknown name is its default, a ratio that is no number in 0..1 is 1)."""
    name = environ.get(SAMPLER, DEFAULT_SAMPLER).strip().lower()
    parent_based, takes_ratio, ratio = SAMPLERS.get(name, SAMPLERS[DEFAULT_SAMPLER])
    if takes_ratio:
        try:
            ratio = float(environ.get(SAMPLER_ARG, ""))
        except ValueError:
            ratio = 1.0
        if not 0.0 <= ratio <= 1.0:
            ratio = 1.0
    return HeadSampler(ratio, parent_based)


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """What a process needs to know about tracing beyond what the SDK reads itself."""

    capture_prompts: bool = False  # prompt and answer text in spans (the deployment opted in)
    # Which requests are recorded, decided before any span is built.
    sampler: HeadSampler = field(default_factory=HeadSampler)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> TracingConfig | None:
        """The configuration the environment holds; None when tracing is off: no OTLP endpoint,
        the traces exporter set to `none`, or the SDK disabled (OTEL_SDK_DISABLED=true)."""
        if not (environ.get(TRACES_ENDPOINT) or environ.get(ENDPOINT)):
            return None
        if environ.get(TRACES_EXPORTER, "otlp").strip().lower() == "none":
            return None
        if environ.get(SDK_DISABLED, "").strip().lower() == "true":
            return None
        return cls(
            capture_prompts=environ.get(CAPTURE_CONTENT, "").strip().lower() == "true",
            sampler=sampler_of(environ),
        )
