"""The replica's spans, in OpenTelemetry: the one module of the replica that imports it, loaded by
`cli` only when tracing is configured (`batchd.api.tracing_config`).

Whether a request is recorded is decided first, from its headers alone (`batchd.api.tracecontext`):
one that is not costs a header scan and a random draw, and gets nothing else.
- A SERVER span per recorded inference request, continuing the caller's `traceparent` (the
  router's, or a traced client's): the HTTP route and status, the OpenTelemetry GenAI attributes
  where the route or the model's task is one of theirs (`gen_ai.operation.name`, the model, token
  usage, time to first token), the time its items waited in the queue, its priority class and
  its caller.
- A span per batch, or model call, that carried a recorded request: a child of the first of them,
  so that its trace shows where the request's time went, and LINKED to every recorded request it
  carried; with its size, its wait and its model time. It is the current span while the model
  computes, so that spans a handler makes itself nest under it. A batch that carried none is
  current too, as a context nobody records, so that a handler's spans in it are not recorded.
- A span per decoding run of token-level generation (from the first recorded request that joins
  the running sequences until none is left running): a child of that request, LINKED to every
  recorded request that joined it, with its sequences, forward passes and model time.
- A CLIENT span per call the model makes to another deployment (`handles`), whose context goes
  to the callee: a composed request is one trace, callee included. A call for requests nobody
  records tells the callee so, and it records nothing either.

No prompt or answer text goes into a span unless the deployment opted in (`capture_prompts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes, http_attributes, url_attributes
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from batchd.api.routes import (
    OPENAI_CHAT_COMPLETIONS,
    OPENAI_COMPLETIONS,
    OPENAI_EMBEDDINGS,
    V2_GENERATE,
    V2_GENERATE_STREAM,
)
from batchd.api.spans import OwnSpan, context_headers, new_span_id, new_trace_id, remote_context
from batchd.api.spec import BatchedDeployment
from batchd.api.tracecontext import caller_of, unrecorded_traceparent
from batchd.api.tracing import Pipeline
from batchd.api.tracing_config import TracingConfig
from batchd.replica.queueing import caller_in, tenant_of
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
TENANT = "batchd.tenant"
OUTCOME = "batchd.outcome"  # as batchd_requests_total counts it: success, timeout, rejected, ...
DEPLOYMENT = "batchd.deployment"
BATCH_SIZE = "batchd.batch.size"
BATCH_REQUESTS = "batchd.batch.requests"
BATCH_WAIT_S = "batchd.batch.wait_s"  # from the batch's oldest item arriving to the batch leaving
BATCH_MODEL_S = "batchd.batch.model_s"  # the model's time on the batch
BATCH_ISOLATION_CALLS = "batchd.batch.isolation_calls"
DECODE_SEQUENCES = "batchd.decode.sequences"  # sequences that joined the run while it was recorded
DECODE_PREFILLS = "batchd.decode.prefills"  # forward passes over new prompts
DECODE_STEPS = "batchd.decode.steps"  # forward passes making one token of every running sequence
DECODE_MAX_RUNNING = "batchd.decode.max_running"  # the most rows of one forward pass
CALLEE_ALIAS = "batchd.callee.alias"
CALLEE_DEPLOYMENT = "batchd.callee.deployment"


class ReplicaTracing:
    """`batchd.replica.traces.Tracing`, in OpenTelemetry: only the requests it records get a span."""

    def __init__(self, pipeline: Pipeline, manifest: BatchedDeployment, config: TracingConfig) -> None:
        self._pipeline = pipeline
        self._spans = pipeline.writer("batchd.replica")
        self._sampler = config.sampler
        self._capture = config.capture_prompts
        self._model = manifest.model_name
        self._deployment = manifest.metadata.name
        self._task_operation = TASK_OPERATIONS.get(manifest.spec.model.task or "")

    def request_started(
        self, operation: str, route_path: str, method: str, path: str, headers: list[tuple[bytes, bytes]]
    ) -> _RequestSpan | None:
        parent = caller_of(headers)
        trace_id = self._sampler.decide(parent)
        if not trace_id:
            return None  # not recorded: nothing more is spent on it
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
        context = None if parent is None else remote_context(parent)
        span = self._spans.start(name, trace_id, context, SpanKind.SERVER, attributes)
        return _RequestSpan(span, self._capture)

    def batch_started(
        self, requests: Sequence[RequestTrace], size: int, waited_s: float
    ) -> _BatchSpan | _UnrecordedBatch:
        spans = [request for request in requests if isinstance(request, _RequestSpan)]
        if not spans:
            return _UnrecordedBatch()
        parent = spans[0].span.context
        span = self._spans.start(
            f"batch {self._model}",
            parent.trace_id,
            parent,
            attributes={
                DEPLOYMENT: self._deployment,
                gen_ai.GEN_AI_REQUEST_MODEL: self._model,
                BATCH_SIZE: size,
                BATCH_REQUESTS: len(spans),
                BATCH_WAIT_S: waited_s,
            },
            links=[request.span.context for request in spans],
        )
        return _BatchSpan(span)

    def decoding_started(self, first: RequestTrace) -> _DecodingSpan:
        assert isinstance(first, _RequestSpan)
        parent = first.span.context
        attributes = {DEPLOYMENT: self._deployment, gen_ai.GEN_AI_REQUEST_MODEL: self._model}
        return _DecodingSpan(
            self._spans.start(f"decode {self._model}", parent.trace_id, parent, attributes=attributes)
        )

    def shutdown(self) -> None:
        self._pipeline.shutdown()


class _RequestSpan:
    """One recorded request's SERVER span."""

    __slots__ = ("_capture", "_first_token_s", "_messages", "_queued_s", "_tokens", "exemplar", "span")

    def __init__(self, span: OwnSpan, capture: bool) -> None:
        self.span = span
        self.exemplar = {"trace_id": format(span.trace_id, "032x")}
        self._capture = capture
        self._queued_s: float | None = None
        self._first_token_s: float | None = None
        self._tokens: tuple[int, int] | None = None
        self._messages: list[tuple[str, str, str]] = []

    def dispatched(self, queued_s: float, priority_class: str, caller: str) -> None:
        if self._queued_s is None:  # the first of its items: the class and caller are the request's
            self.span.attributes[PRIORITY_CLASS] = priority_class
            if caller_in(caller):
                self.span.attributes[FAIRNESS_ID] = caller_in(caller)
            self.span.attributes[TENANT] = tenant_of(caller)
        self._queued_s = max(self._queued_s or 0.0, queued_s)

    def first_token(self, seconds: float) -> None:
        if self._first_token_s is None:
            self._first_token_s = seconds

    def tokens(self, prompt_tokens: int, generated_tokens: int) -> None:
        prompt, generated = self._tokens or (0, 0)
        self._tokens = (prompt + prompt_tokens, generated + generated_tokens)

    @property
    def captures_text(self) -> bool:
        return self._capture

    def prompt_text(self, prompt: str, completion: str, finish_reason: str) -> None:
        if self._capture:
            self._messages.append((prompt, completion, finish_reason))

    def finished(self, status: int, outcome: str, error: BaseException | None) -> None:
        span = self.span
        attributes = span.attributes
        attributes[http_attributes.HTTP_RESPONSE_STATUS_CODE] = status
        attributes[OUTCOME] = outcome
        if self._queued_s is not None:
            attributes[QUEUE_S] = self._queued_s
        if self._first_token_s is not None:
            attributes[gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = self._first_token_s
        if self._tokens is not None:
            attributes[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] = self._tokens[0]
            attributes[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] = self._tokens[1]
        if self._messages:
            attributes.update(_messages(self._messages))
        if error is not None:
            attributes[error_attributes.ERROR_TYPE] = type(error).__qualname__
            if status >= 500:  # a server span is in error for what the server failed, not the client
                span.fail(str(error))
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
    """A recorded batch's span, current (in OpenTelemetry's context too, for a handler's own spans)
    until `finished`."""

    __slots__ = ("_token", "span")

    def __init__(self, span: OwnSpan) -> None:
        self.span = span
        self._token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(span.context)))

    def call_started(self, alias: str, deployment: str, url: str) -> _CallSpan:
        batch = self.span
        span = batch.writer.start(
            f"call {alias}",
            batch.trace_id,
            batch.context,
            SpanKind.CLIENT,
            {CALLEE_ALIAS: alias, CALLEE_DEPLOYMENT: deployment, url_attributes.URL_FULL: url},
        )
        return _CallSpan(span)

    def isolated(self, extra_calls: int) -> None:
        self.span.attributes[BATCH_ISOLATION_CALLS] = extra_calls

    def finished(self, model_s: float, error: BaseException | None) -> None:
        span = self.span
        span.attributes[BATCH_MODEL_S] = model_s
        if error is not None:
            span.attributes[error_attributes.ERROR_TYPE] = type(error).__qualname__
            span.fail(str(error))
        otel_context.detach(self._token)
        span.end()


class _DecodingSpan:
    """A decoding run's span, kept by the engine's thread alone."""

    __slots__ = ("_links", "_max_running", "_model_s", "_prefills", "_sequences", "_steps", "span")

    def __init__(self, span: OwnSpan) -> None:
        self.span = span
        self._links: list[SpanContext] = []
        self._sequences = self._prefills = self._steps = self._max_running = 0
        self._model_s = 0.0

    def joined(self, requests: Sequence[RequestTrace], sequences: int) -> None:
        self._sequences += sequences
        self._links += (request.span.context for request in requests if isinstance(request, _RequestSpan))

    def stepped(self, kind: str, sequences: int, seconds: float) -> None:
        if kind == "prefill":
            self._prefills += 1
        else:
            self._steps += 1
        self._max_running = max(self._max_running, sequences)
        self._model_s += seconds

    def finished(self) -> None:
        span = self.span
        span.links = self._links
        span.attributes.update(
            {
                DECODE_SEQUENCES: self._sequences,
                BATCH_REQUESTS: len(self._links),
                DECODE_PREFILLS: self._prefills,
                DECODE_STEPS: self._steps,
                DECODE_MAX_RUNNING: self._max_running,
                BATCH_MODEL_S: self._model_s,
            }
        )
        span.end()


# The context of a batch nobody records: the spans a handler makes in it are not recorded either
# (parent-based sampling follows it), so that no trace is recorded in part.
_UNRECORDED = trace.set_span_in_context(
    NonRecordingSpan(SpanContext(new_trace_id(), new_span_id(), False, TraceFlags(0)))
)


class _UnrecordedBatch:
    """A batch that carried no recorded request: no span, and calls that tell the callee so."""

    __slots__ = ("_token",)

    def __init__(self) -> None:
        self._token = otel_context.attach(_UNRECORDED)

    def call_started(self, alias: str, deployment: str, url: str) -> _UnrecordedCall:
        return _UnrecordedCall()

    def isolated(self, extra_calls: int) -> None:
        pass

    def finished(self, model_s: float, error: BaseException | None) -> None:
        otel_context.detach(self._token)


class _CallSpan:
    """A call to another deployment: its CLIENT span and the headers that carry it."""

    __slots__ = ("headers", "span")

    def __init__(self, span: OwnSpan) -> None:
        self.span = span
        self.headers = context_headers(span.context)

    def finished(self, status: int | None, error: BaseException | None) -> None:
        span = self.span
        if status is not None:
            span.attributes[http_attributes.HTTP_RESPONSE_STATUS_CODE] = status
        if error is not None:
            span.attributes[error_attributes.ERROR_TYPE] = type(error).__qualname__
            span.fail(str(error))
        span.end()


class _UnrecordedCall:
    """A call made for requests nobody records: the callee is told not to record it either."""

    __slots__ = ("headers",)

    def __init__(self) -> None:
        self.headers = {"traceparent": unrecorded_traceparent().decode()}

    def finished(self, status: int | None, error: BaseException | None) -> None:
        pass


__all__ = ["ReplicaTracing"]
