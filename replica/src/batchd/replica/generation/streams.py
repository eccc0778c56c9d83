"""One generation request's answer as it comes, chunk by chunk (`SequenceStream`), bounded by
the request's one deadline and its client (`batchd.replica.waiting`), whichever scheduler feeds
it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from batchd.replica.errors import ClientDisconnected, DeadlineExceeded
from batchd.replica.generation.params import Chunk, Completion, GenerationRequest, TokenLogprob
from batchd.replica.waiting import Abandoned, Client

# How a stream is fed: chunks in order, or the error that ends it.
Deliver = Callable[["Chunk | BaseException"], None]


def _nothing() -> None:
    pass


class SequenceObserver(Protocol):
    """Where the service reports each request's timings; the metrics module implements it."""

    def first_token(self, seconds: float, exemplar: dict[str, str] | None = None) -> None: ...

    def sequence_done(self, prompt_tokens: int, generated_tokens: int, per_token_s: float | None) -> None: ...


class SequenceStream(AbstractAsyncContextManager["SequenceStream"]):
    """One request's chunks, as they come: iterate inside `async with`; leaving it early (an
    error, a disconnect) frees the sequence. Raises DeadlineExceeded, ClientDisconnected, or
    the model's error, instead of a chunk.

    A consumer that wants only the whole answer (`complete`) is woken for the first chunk (its
    time to first token) and then once more for the rest, at the last chunk or an error, not for
    every token: the event loop's work per answer then does not grow with its length, and the
    engine's core is not spent waking tasks."""

    def __init__(
        self,
        start: Callable[[Deliver], Callable[[], None]],
        request: GenerationRequest,
        request_timeout_s: float,
        client: Client,
        observer: SequenceObserver | None,
        on_open: Callable[[], None] = _nothing,
        on_close: Callable[[], None] = _nothing,
    ) -> None:
        self.request = request
        self._start = start
        self._request_timeout_s = request_timeout_s
        self._client = client
        self._observer = observer
        self._on_open = on_open
        self._on_close = on_close
        self._queue: asyncio.Queue[Chunk | BaseException] = asyncio.Queue()
        self._held: Chunk | BaseException | None = None  # taken from the queue by `ready`, not yet handed out
        self._whole = False  # set by `complete`: the chunks after the first wait for the last
        self._kept: list[Chunk] = []  # those chunks, until the last comes
        self._delivered = False  # a first chunk has gone to the queue
        self._cancel: Callable[[], None] = _nothing
        self._finished = False
        self._timer: asyncio.TimerHandle | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._started = time.perf_counter()
        self._first: float | None = None
        self._chunks = 0
        self.generated_tokens = 0
        self.cached_tokens = 0  # of the prompt, from the prefix cache (said by the first chunk)
        trace = client.trace
        # The answer's text, kept only for a span that records it (the deployment opted in).
        self._text: list[str] | None = [] if trace is not None and trace.captures_text else None

    async def __aenter__(self) -> SequenceStream:
        self._on_open()
        loop = asyncio.get_running_loop()
        deadline, late = self._client.deadline(loop.time(), self._request_timeout_s)
        self._timer = loop.call_at(deadline, self._give_up, DeadlineExceeded.passed(late))
        if self._client.gone is not None:
            self._watcher = loop.create_task(self._watch(self._client.gone), name="batchd-generation-client")
        self._cancel = self._start(self._deliver)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if not self._finished:
            self._cancel()
        if self._timer is not None:
            self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        self._on_close()

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self

    async def __anext__(self) -> Chunk:
        if self._finished:
            raise StopAsyncIteration
        if self._held is not None:
            item, self._held = self._held, None
            return self._take(item)
        return self._take(await self._queue.get())

    def ready(self) -> list[Chunk]:
        """The chunks that have come already, without waiting: a busy client gets them in one write.
        An error among them is raised by the next `__anext__`."""
        chunks: list[Chunk] = []
        while self._held is None and not self._finished and not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, BaseException) or item.error is not None:
                self._held = item
                break
            chunks.append(self._take(item))
        return chunks

    def _deliver(self, item: Chunk | BaseException) -> None:
        """The scheduler's chunk (or error), queued for the consumer; for `complete`, the chunks
        between the first and the last are kept and queued together (one wake-up)."""
        if self._whole and isinstance(item, Chunk) and item.finish_reason is None and self._delivered:
            self._kept.append(item)
            return
        self._delivered = True
        for kept in self._kept:
            self._queue.put_nowait(kept)
        self._kept.clear()
        self._queue.put_nowait(item)

    def _take(self, item: Chunk | BaseException) -> Chunk:
        if isinstance(item, BaseException):
            raise item
        if item.error is not None:
            self._finished = True  # the engine has dropped the sequence already
            raise item.error
        self._account(item)
        return item

    async def complete(self) -> Completion:
        """Every chunk, joined: the whole answer."""
        self._whole = True
        pieces: list[str] = []
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        finish = "length"
        async for chunk in self:
            pieces.append(chunk.text)
            tokens.extend(chunk.token_ids)
            logprobs.extend(chunk.logprobs)
            finish = chunk.finish_reason or finish
        prompt_tokens = len(self.request.prompt_ids)
        return Completion(
            "".join(pieces), finish, prompt_tokens, tuple(tokens), tuple(logprobs), self.cached_tokens
        )

    def _account(self, chunk: Chunk) -> None:
        now = time.perf_counter()
        trace = self._client.trace
        if self._first is None and chunk.tokens:
            self._first = now
            if self._observer is not None:
                self._observer.first_token(now - self._started, None if trace is None else trace.exemplar)
            if trace is not None:
                trace.first_token(now - self._started)
        self.generated_tokens += chunk.tokens
        self.cached_tokens += chunk.cached_tokens
        if self._text is not None:
            self._text.append(chunk.text)
        if chunk.finish_reason is not None:
            self._finished = True
            if self._observer is not None:
                per_token = (
                    (now - self._first) / (self.generated_tokens - 1)
                    if self._first and self.generated_tokens > 1
                    else None
                )
                self._observer.sequence_done(len(self.request.prompt_ids), self.generated_tokens, per_token)
            if trace is not None:
                trace.tokens(len(self.request.prompt_ids), self.generated_tokens)
                if self._text is not None:
                    trace.prompt_text(self.request.prompt, "".join(self._text), chunk.finish_reason)

    def _give_up(self, why: BaseException) -> None:
        if not self._finished:
            self._cancel()
            self._queue.put_nowait(why)

    async def _watch(self, abandoned: Abandoned) -> None:
        await abandoned()
        self._give_up(ClientDisconnected.before_answer())
