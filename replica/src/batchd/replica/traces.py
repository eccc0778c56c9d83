"""What the core tells of a request's and a batch's time, for tracing: the seams that the replica's
tracing module (`batchd.replica.tracing`, the one module that imports OpenTelemetry) fills.

A recorded request carries its trace in `Client.trace` (a request that is not recorded carries
none, as with tracing off); the batcher tells it when its items left the queue, and opens a
batch's trace (`BatchTracer.batch_started`) for each model call. While the model computes, the
batch's trace is the current one here (`current_batch`), and it travels with the context to the
handler's own event loop, where a handle to another deployment sends it on
(`BatchTrace.call_started`).

With tracing off nothing here is set: requests carry no trace, the batcher has no tracer, and no
OpenTelemetry code is loaded.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Protocol


class RequestTrace(Protocol):
    """One recorded request's span."""

    @property
    def exemplar(self) -> dict[str, str]:
        """`{"trace_id": ...}`, for the latency histograms' exemplars."""
        ...

    def dispatched(self, queued_s: float, priority_class: str, caller: str) -> None:
        """One of its items left the queue for the model after `queued_s` in it, in the priority
        class and as the caller the batcher served it by."""
        ...

    def first_token(self, seconds: float) -> None:
        """Its first new token came, `seconds` after it was admitted (generation)."""
        ...

    def tokens(self, prompt_tokens: int, generated_tokens: int) -> None:
        """One of its sequences finished with these counts (generation; several add up)."""
        ...

    @property
    def captures_text(self) -> bool:
        """Whether `prompt_text` keeps anything (the deployment opted in)."""
        ...

    def prompt_text(self, prompt: str, completion: str, finish_reason: str) -> None:
        """One of its sequences' prompt and answer: kept only where the deployment opted in."""
        ...

    def finished(self, status: int, outcome: str, error: BaseException | None) -> None:
        """It was answered with `status` (its outcome as the metrics count it); the span ends."""
        ...


class CallTrace(Protocol):
    """The span of one call the model makes to another deployment (`handles`)."""

    @property
    def headers(self) -> dict[str, str]:
        """What carries the call's context to the callee."""
        ...

    def finished(self, status: int | None, error: BaseException | None) -> None:
        """The call was answered `status` (None: no answer), or failed with `error`."""
        ...


class BatchTrace(Protocol):
    """The trace of one model call, the current one while the model computes it: its span, where
    it carried a recorded request."""

    def call_started(self, alias: str, deployment: str, url: str) -> CallTrace:
        """A call to another deployment (`alias` of model.calls, naming `deployment`, at `url`),
        made by the model while it computes this batch."""
        ...

    def isolated(self, extra_calls: int) -> None:
        """A failure was isolated with `extra_calls` more model calls (`isolate_failures`)."""
        ...

    def finished(self, model_s: float, error: BaseException | None) -> None:
        """The model call is over, after `model_s`; `error` when it failed."""
        ...


class BatchTracer(Protocol):
    """Opens a batch's span."""

    def batch_started(self, requests: Sequence[RequestTrace], size: int, waited_s: float) -> BatchTrace:
        """The trace of a batch of `size` items whose oldest waited `waited_s`, carrying the items
        of `requests` (the recorded ones; maybe none)."""
        ...


class DecodingTrace(Protocol):
    """The span of one decoding run of token-level generation: from the first recorded request
    that joins the engine's running sequences until none is left running. Told on the engine's
    thread."""

    def joined(self, requests: Sequence[RequestTrace], sequences: int) -> None:
        """`sequences` sequences joined the run, those of `requests` recorded (maybe none)."""
        ...

    def stepped(self, kind: str, sequences: int, seconds: float) -> None:
        """A forward pass (`prefill` or `decode`) of `sequences` rows took `seconds`."""
        ...

    def finished(self) -> None:
        """No sequence is left running: the span ends."""
        ...


class DecodingTracer(Protocol):
    """Opens a decoding run's span."""

    def decoding_started(self, first: RequestTrace) -> DecodingTrace:
        """The span of a decoding run that `first` (a recorded request) joins first."""
        ...


class Tracing(BatchTracer, DecodingTracer, Protocol):
    """The replica's tracing: a span per request, and one per batch or decoding run."""

    def request_started(
        self, operation: str, route_path: str, method: str, path: str, headers: list[tuple[bytes, bytes]]
    ) -> RequestTrace | None:
        """The span of a request to the route `operation` (whose template is `route_path`),
        continuing the caller's trace where its headers carry one; None when it is not recorded."""
        ...


_current_batch: contextvars.ContextVar[BatchTrace | None] = contextvars.ContextVar(
    "batchd_current_batch_trace", default=None
)


def set_current_batch(trace: BatchTrace | None) -> contextvars.Token[BatchTrace | None]:
    return _current_batch.set(trace)


def reset_current_batch(token: contextvars.Token[BatchTrace | None]) -> None:
    _current_batch.reset(token)


def current_batch() -> BatchTrace | None:
    """The span of the batch the model is computing in this context; None outside one, or untraced."""
    return _current_batch.get()
