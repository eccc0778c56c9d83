"""The replica's spans, in OpenTelemetry: the one module of the replica that imports it, loaded by
`cli` only when tracing is configured (`batchd.api.tracing`).

- A SERVER span per inference request, continuing the caller's `traceparent` (the router's, or a
  traced client's): the HTTP route and status, the OpenTelemetry GenAI attributes where the route
  or the model's task is one of theirs (`gen_ai.operation.name`, the model, token usage, time to
  first token), the time its items waited in the queue, its priority class and its caller.
- A span per batch, or model call: a child of the first recorded request it carried, so that the
  request's trace shows where its time went, and LINKED to every request it carried, recorded or
  not; with its size, its wait and its model time. It is the current span while the model
  computes, so that spans a handler makes itself nest under it.
- A CLIENT span per call the model makes to another deployment (`handles`), whose context goes
  to the callee: a composed request is one trace, callee included.

No prompt or answer text goes into a span unless the deployment opted in (`capture_prompts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes, http_attributes, url_attributes
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from batchd.api import __version__
from batchd.api.otel import extract, inject, propagation_fields
from batchd.api.routes import (
    OPENAI_CHAT_COMPLETIONS,
    OPENAI_COMPLETIONS,
    OPENAI_EMBEDDINGS,
    V2_GENERATE,
    V2_GENERATE_STREAM,
)
from batchd.api.spec import BatchedDeployment
from batchd.api.tracing import TracingConfig
from batchd.replica.traces import RequestTrace

Operation = gen_ai.GenAiOperationNameValues
# The GenAI operation of a route that is one whatever the model (OpenAI's and the generate extension's) ...
ROUTE_OPERATIONS = {
    OPENAI_CHAT_COMPLETIONS.operation: Operation.CHAT.value,
    OPENAI_COMPLETIONS.operation: Operation.TEXT_COMPLETION.value,
    OPENAI_EMBEDDINGS.operation: Operation.EMBEDDINGS.value,
    V2_GENERATE.operation: Operation.TEXT_COMPLETION.value,
    V2_GENERATE_STREAM.operation: Operation.TEXT_COMPLETION.value,
}
# ... and of the routes that serve any model (KServe V1, OIP V2, the simple call), by its task. A
# custom handler or a classifier is no GenAI operation: its spans are plain HTTP ones.
TASK_OPERATIONS = {
    "feature-extraction": Operation.EMBEDDINGS.value,
    "text-generation": Operation.TEXT_COMPLETION.value,
}

# batchd's own attributes, beside the conventions'.
QUEUE_S = "batchd.queue.duration_s"  # the longest any of the request's items waited for a batch
PRIORITY_CLASS = "batchd.priority_class"
FAIRNESS_ID = "batchd.fairness_id"
OUTCOME = "batchd.outcome"  # as batchd_requests_total counts it: success, timeout, rejected, ...
DEPLOYMENT = "batchd.deployment"
BATCH_SIZE = "batchd.batch.size"
BATCH_REQUESTS = "batchd.batch.requests"
BATCH_WAIT_S = "batchd.batch.wait_s"  # from the batch's oldest item arriving to the batch leaving
BATCH_MODEL_S = "batchd.batch.model_s"  # the model's time on the batch
BATCH_ISOLATION_CALLS = "batchd.batch.isolation_calls"
CALLEE_ALIAS = "batchd.callee.alias"
CALLEE_DEPLOYMENT = "batchd.callee.deployment"


class ReplicaTracing:
    """`batchd.replica.traces.Tracing`, with the OpenTelemetry SDK."""

    def __init__(self, provider: TracerProvider, manifest: BatchedDeployment, config: TracingConfig) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("batchd.replica", __version__)
        self._fields = propagation_fields()
        self._capture = config.capture_prompts
        self._model = manifest.model_name
        self._deployment = manifest.metadata.name
        self._task_operation = TASK_OPERATIONS.get(manifest.spec.model.task or "")

    def request_started(
        self, operation: str, route_path: str, method: str, path: str, headers: list[tuple[bytes, bytes]]
    ) -> _RequestSpan:
        parent = extract(headers, self._fields)
        gen_ai_operation = ROUTE_OPERATIONS.get(operation, self._task_operation)
        attributes: dict[str, Any] = {
            http_attributes.HTTP_REQUEST_METHOD: method,
            http_attributes.HTTP_ROUTE: route_path,
            url_attributes.URL_PATH: path,
            DEPLOYMENT: self._deployment,
        }
        if gen_ai_operation is not None:
            name = f"{gen_ai_operation} {self._model}"
            attributes[gen_ai.GEN_AI_OPERATION_NAME] = gen_ai_operation
            attributes[gen_ai.GEN_AI_REQUEST_MODEL] = self._model
            attributes[gen_ai.GEN_AI_RESPONSE_MODEL] = self._model
        else:
            name = f"{method} {route_path}"
        span = self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        return _RequestSpan(span, self._capture)

    def batch_started(
        self, requests: Sequence[RequestTrace], size: int, waited_s: float
    ) -> _BatchSpan | None:
        spans = [request for request in requests if isinstance(request, _RequestSpan)]
        parent = next((request for request in spans if request.sampled), None)
        if parent is None:
            return None  # nobody will look for this batch: no span
        links = [Link(request.span.get_span_context()) for request in spans]
        span = self._tracer.start_span(
            f"batch {self._model}",
            context=trace.set_span_in_context(parent.span),
            links=links,
            attributes={
                DEPLOYMENT: self._deployment,
                gen_ai.GEN_AI_REQUEST_MODEL: self._model,
                BATCH_SIZE: size,
                BATCH_REQUESTS: len(spans),
                BATCH_WAIT_S: waited_s,
            },
        )
        return _BatchSpan(span, self._tracer)

    def shutdown(self) -> None:
        self._provider.shutdown()


class _RequestSpan:
    """One request's SERVER span; what the core tells it is kept only when it is recorded."""

    __slots__ = (
        "_capture",
        "_first_token_s",
        "_messages",
        "_queued_s",
        "_tokens",
        "sampled",
        "span",
        "trace_id",
    )

    def __init__(self, span: Span, capture: bool) -> None:
        self.span = span
        context = span.get_span_context()
        self.sampled = context.trace_flags.sampled
        self.trace_id = format(context.trace_id, "032x") if self.sampled else None
        self._capture = capture
        self._queued_s: float | None = None
        self._first_token_s: float | None = None
        self._tokens: tuple[int, int] | None = None
        self._messages: list[tuple[str, str, str]] = []

    @property
    def exemplar(self) -> dict[str, str] | None:
        return None if self.trace_id is None else {"trace_id": self.trace_id}

    def dispatched(self, queued_s: float, priority_class: str, caller: str) -> None:
        if not self.sampled:
            return
        if self._queued_s is None:  # the first of its items: the class and caller are the request's
            self.span.set_attribute(PRIORITY_CLASS, priority_class)
            if caller:
                self.span.set_attribute(FAIRNESS_ID, caller)
        self._queued_s = max(self._queued_s or 0.0, queued_s)

    def first_token(self, seconds: float) -> None:
        if self._first_token_s is None:
            self._first_token_s = seconds

    def tokens(self, prompt_tokens: int, generated_tokens: int) -> None:
        prompt, generated = self._tokens or (0, 0)
        self._tokens = (prompt + prompt_tokens, generated + generated_tokens)

    @property
    def captures_text(self) -> bool:
        return self._capture and self.sampled

    def prompt_text(self, prompt: str, completion: str, finish_reason: str) -> None:
        if self._capture and self.sampled:
            self._messages.append((prompt, completion, finish_reason))

    def finished(self, status: int, outcome: str, error: BaseException | None) -> None:
        span = self.span
        if self.sampled:
            attributes: dict[str, Any] = {http_attributes.HTTP_RESPONSE_STATUS_CODE: status, OUTCOME: outcome}
            if self._queued_s is not None:
                attributes[QUEUE_S] = self._queued_s
            if self._first_token_s is not None:
                attributes[gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = self._first_token_s
            if self._tokens is not None:
                attributes[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] = self._tokens[0]
                attributes[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] = self._tokens[1]
            if self._messages:
                attributes.update(_messages(self._messages))
            span.set_attributes(attributes)
            if error is not None:
                span.set_attribute(error_attributes.ERROR_TYPE, type(error).__qualname__)
                if status >= 500:  # a server span is in error for what the server failed, not the client
                    span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()


def _messages(messages: list[tuple[str, str, str]]) -> dict[str, str]:
    """The GenAI conventions' `gen_ai.input.messages` and `gen_ai.output.messages` (JSON)."""
    inputs = [{"role": "user", "parts": [{"type": "text", "content": prompt}]} for prompt, _, _ in messages]
    outputs = [
        {"role": "assistant", "parts": [{"type": "text", "content": answer}], "finish_reason": finish}
        for _, answer, finish in messages
    ]
    return {
        gen_ai.GEN_AI_INPUT_MESSAGES: orjson.dumps(inputs).decode(),
        gen_ai.GEN_AI_OUTPUT_MESSAGES: orjson.dumps(outputs).decode(),
    }


class _BatchSpan:
    """A batch's span, current (in OpenTelemetry's context too) until `finished`."""

    __slots__ = ("_token", "_tracer", "span")

    def __init__(self, span: Span, tracer: trace.Tracer) -> None:
        self.span = span
        self._tracer = tracer
        self._token = otel_context.attach(trace.set_span_in_context(span))

    def call_started(self, alias: str, deployment: str, url: str) -> _CallSpan:
        span = self._tracer.start_span(
            f"call {alias}",
            context=trace.set_span_in_context(self.span),
            kind=SpanKind.CLIENT,
            attributes={CALLEE_ALIAS: alias, CALLEE_DEPLOYMENT: deployment, url_attributes.URL_FULL: url},
        )
        return _CallSpan(span)

    def isolated(self, extra_calls: int) -> None:
        self.span.set_attribute(BATCH_ISOLATION_CALLS, extra_calls)

    def finished(self, model_s: float, error: BaseException | None) -> None:
        span = self.span
        span.set_attribute(BATCH_MODEL_S, model_s)
        if error is not None:
            span.set_attribute(error_attributes.ERROR_TYPE, type(error).__qualname__)
            span.set_status(Status(StatusCode.ERROR, str(error)))
        otel_context.detach(self._token)
        span.end()


class _CallSpan:
    """A call to another deployment: its CLIENT span and the headers that carry it."""

    __slots__ = ("headers", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.headers = inject(trace.set_span_in_context(span))

    def finished(self, status: int | None, error: BaseException | None) -> None:
        span = self.span
        if status is not None:
            span.set_attribute(http_attributes.HTTP_RESPONSE_STATUS_CODE, status)
        if error is not None:
            span.set_attribute(error_attributes.ERROR_TYPE, type(error).__qualname__)
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()


__all__ = ["ReplicaTracing"]
