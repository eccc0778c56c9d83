"""The event loop's side of text generation: admission, one deadline, disconnects, streams.

What every other route gets from the batcher, a generation request gets here, with the same
errors from `errors.py`: 503 with Retry-After when `max_queued_requests` sequences already wait
(or the replica drains), 504 at its deadline (`waiting`), and a client that leaves
frees its sequence at the next step. The model never runs on the loop: the loop only tokenizes
a prompt (to check it fits), hands the sequence to the engine, and moves chunks to the request.

`TokenLevel` serves through the engine (the default); `request_level.RequestLevel` serves the
same requests through the batcher. Both answer `open()` with a `SequenceStream`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

from batchd.api.spec import BatchingSpec
from batchd.replica.errors import ClientDisconnected, DeadlineExceeded, Draining, InvalidInput, QueueFull
from batchd.replica.generation.engine import GenerationEngine, SequenceState
from batchd.replica.generation.params import (
    Chunk,
    Completion,
    GenerationLimits,
    GenerationParams,
    GenerationRequest,
    TokenLogprob,
    check_prompt,
    parse_parameters,
)
from batchd.replica.waiting import NO_CLIENT, Abandoned, Client

# How a stream is fed: chunks in order, or the error that ends it.
Deliver = Callable[["Chunk | BaseException"], None]


def _nothing() -> None:
    pass


class Encoder(Protocol):
    """A tokenizer, as far as turning text (or a chat) into tokens goes."""

    def __call__(self, text: str, **kwargs: Any) -> Any: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = ...) -> Any: ...

    @property
    def chat_template(self) -> Any: ...

    def __len__(self) -> int: ...


class SequenceObserver(Protocol):
    """Where the service reports each request's timings; the metrics module implements it."""

    def first_token(self, seconds: float) -> None: ...

    def sequence_done(self, prompt_tokens: int, generated_tokens: int, per_token_s: float | None) -> None: ...


class Preparer:
    """A request's text and parameters, checked and tokenized: what the engine or the batcher runs."""

    def __init__(
        self,
        encoder: Encoder,
        limits: GenerationLimits,
        defaults: GenerationParams,
        chat_template: str | None = None,
    ) -> None:
        self._encoder = encoder
        self.limits = limits
        self.defaults = defaults
        self._chat_template = chat_template  # model.generation.chat_template, over the tokenizer's

    def prepare(self, text: Any, parameters: Any, field: str) -> GenerationRequest:
        return self.prepare_with(text, parse_parameters(parameters, self.limits, self.defaults), field)

    def prepare_with(self, text: Any, params: GenerationParams, field: str) -> GenerationRequest:
        """A prompt with parameters already read (`parse_parameters`)."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput(f"{field}: expected a non-empty string, got {text!r:.60}")
        prompt_ids = tuple(int(token) for token in self._encoder(text)["input_ids"])
        check_prompt(len(prompt_ids), params, self.limits, field)
        return GenerationRequest(text, prompt_ids, params)

    def prepare_ids(
        self, prompt_ids: Sequence[int], params: GenerationParams, field: str
    ) -> GenerationRequest:
        """A prompt given as token ids (each already checked to be an integer)."""
        size = len(self._encoder)
        for index, token in enumerate(prompt_ids):
            if not 0 <= token < size:
                raise InvalidInput(
                    f"{field}[{index}]: token id {token} is not in the vocabulary (0 to {size - 1})"
                )
        check_prompt(len(prompt_ids), params, self.limits, field)
        text = str(self._encoder.decode(list(prompt_ids), skip_special_tokens=False))
        return GenerationRequest(text, tuple(prompt_ids), params)

    def token_text(self, token: int) -> str:
        """One token's text on its own (a piece of a character where it holds only part of one)."""
        return str(self._encoder.decode([token], skip_special_tokens=False))

    def prepare_chat(
        self, messages: list[dict[str, str]], params: GenerationParams, field: str
    ) -> GenerationRequest:
        """The conversation as the model's chat template writes it, ready for the assistant's turn.
        InvalidInput naming `field` when the model has no template (and the spec names none)."""
        template = self._chat_template
        if template is None and not self._encoder.chat_template:
            raise InvalidInput(
                f"{field}: this model has no chat template; send a prompt to /v1/completions, or set "
                "model.generation.chat_template"
            )
        try:
            prompt = str(
                self._encoder.apply_chat_template(
                    messages, chat_template=template, tokenize=False, add_generation_prompt=True
                )
            )
        except Exception as error:  # the template's own checks (roles, order) raise
            raise InvalidInput(f"{field}: the chat template refused the conversation: {error}") from None
        # The template writes the special tokens (a BOS) itself: the tokenizer must not add them again.
        prompt_ids = tuple(
            int(token) for token in self._encoder(prompt, add_special_tokens=False)["input_ids"]
        )
        check_prompt(len(prompt_ids), params, self.limits, field)
        return GenerationRequest(prompt, prompt_ids, params)


class SequenceStream(AbstractAsyncContextManager["SequenceStream"]):
    """One request's chunks, as they come: iterate inside `async with`; leaving it early (an
    error, a disconnect) frees the sequence. Raises DeadlineExceeded, ClientDisconnected, or
    the model's error, instead of a chunk."""

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
        self._cancel: Callable[[], None] = _nothing
        self._finished = False
        self._timer: asyncio.TimerHandle | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._started = time.perf_counter()
        self._first: float | None = None
        self._chunks = 0
        self.generated_tokens = 0

    async def __aenter__(self) -> SequenceStream:
        self._on_open()
        loop = asyncio.get_running_loop()
        deadline, late = self._client.deadline(loop.time(), self._request_timeout_s)
        self._timer = loop.call_at(deadline, self._give_up, DeadlineExceeded.passed(late))
        if self._client.gone is not None:
            self._watcher = loop.create_task(self._watch(self._client.gone), name="batchd-generation-client")
        self._cancel = self._start(self._queue.put_nowait)
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
        return Completion("".join(pieces), finish, prompt_tokens, tuple(tokens), tuple(logprobs))

    def _account(self, chunk: Chunk) -> None:
        now = time.perf_counter()
        if self._first is None and chunk.tokens:
            self._first = now
            if self._observer is not None:
                self._observer.first_token(now - self._started)
        self.generated_tokens += chunk.tokens
        if chunk.finish_reason is not None:
            self._finished = True
            if self._observer is not None:
                per_token = (
                    (now - self._first) / (self.generated_tokens - 1)
                    if self._first and self.generated_tokens > 1
                    else None
                )
                self._observer.sequence_done(len(self.request.prompt_ids), self.generated_tokens, per_token)

    def _give_up(self, why: BaseException) -> None:
        if not self._finished:
            self._cancel()
            self._queue.put_nowait(why)

    async def _watch(self, abandoned: Abandoned) -> None:
        await abandoned()
        self._give_up(ClientDisconnected.before_answer())


class GenerationService(Protocol):
    """What the routes use, whether sequences are scheduled by token or by request."""

    preparer: Preparer

    @property
    def scheduling(self) -> Literal["token", "request"]:
        """ "token": sequences have their own queue and rows, and count as items in the replica's
        load; "request": they are the batcher's items."""
        ...

    @property
    def kv_usage(self) -> float:
        """The share of the key-value cache that running sequences hold (0 with none kept)."""
        ...

    @property
    def waiting(self) -> int: ...

    @property
    def running(self) -> int: ...

    @property
    def longest_step_s(self) -> float: ...

    def open(self, request: GenerationRequest, client: Client = NO_CLIENT) -> SequenceStream: ...

    async def complete(
        self, requests: Sequence[GenerationRequest], client: Client = NO_CLIENT
    ) -> list[Completion]: ...

    def reconfigure(self, config: BatchingSpec) -> None: ...

    def begin_draining(self) -> None: ...

    async def drain(self) -> None: ...


class TokenLevel:
    """Sequences scheduled by the engine, a token at a time."""

    scheduling: Literal["token"] = "token"

    def __init__(
        self,
        engine: GenerationEngine,
        preparer: Preparer,
        config: BatchingSpec,
        observer: SequenceObserver | None = None,
    ) -> None:
        self.engine = engine
        self.preparer = preparer
        self._config = config
        self._observer = observer
        self._draining = False
        self._open = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._seconds_per_sequence = 1.0  # recent, for Retry-After
        engine.set_max_running(config.max_batch_size)

    @property
    def waiting(self) -> int:
        return self.engine.waiting

    @property
    def running(self) -> int:
        return self.engine.running

    @property
    def kv_usage(self) -> float:
        return self.engine.held_tokens / max(1, self.engine.capacity_tokens)

    @property
    def longest_step_s(self) -> float:
        started = self.engine.step_started
        return 0.0 if started is None else time.monotonic() - started

    def open(self, request: GenerationRequest, client: Client = NO_CLIENT) -> SequenceStream:
        """Admit one sequence (or raise Draining or QueueFull); iterate the stream inside `async with`."""
        self._admit(1)
        return self._stream(request, client)

    async def complete(
        self, requests: Sequence[GenerationRequest], client: Client = NO_CLIENT
    ) -> list[Completion]:
        """Whole answers for several prompts (one request's instances): all admitted, or none."""
        self._admit(len(requests))
        streams = [self._stream(request, client) for request in requests]

        async def one(stream: SequenceStream) -> Completion:
            async with stream:
                return await stream.complete()

        tasks = [asyncio.ensure_future(one(stream)) for stream in streams]
        try:
            return [await task for task in tasks]
        finally:  # one failed (or the request was cancelled): the others stop too
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def reconfigure(self, config: BatchingSpec) -> None:
        self._config = config
        self.engine.set_max_running(config.max_batch_size)

    def begin_draining(self) -> None:
        self._draining = True

    async def drain(self) -> None:
        """Admit nothing new; let every admitted sequence finish; then stop the engine."""
        self.begin_draining()
        await self._idle.wait()
        await asyncio.to_thread(self.engine.stop)

    def _admit(self, count: int) -> None:
        if self._draining:
            raise Draining()
        # A sequence waits only when no row is free: those the engine has yet to pick up for a
        # free row are not waiting behind anyone.
        free_rows = max(0, self.engine.max_running - self.engine.running)
        free = self._config.max_queued_requests + free_rows - self.engine.waiting
        if count > free:
            batches_ahead = self.engine.waiting / max(1, self._config.max_batch_size) + 1
            raise QueueFull(count, max(0, free), batches_ahead * self._seconds_per_sequence)

    def _stream(self, request: GenerationRequest, client: Client) -> SequenceStream:
        started = time.perf_counter()

        def opened() -> None:
            self._open += 1
            self._idle.clear()

        def start(deliver: Deliver) -> Callable[[], None]:
            sequence = SequenceState(request, deliver)
            self.engine.submit(sequence)
            return lambda: self.engine.cancel(sequence)

        def closed() -> None:
            self._seconds_per_sequence += 0.2 * (time.perf_counter() - started - self._seconds_per_sequence)
            self._open -= 1
            if self._open == 0:
                self._idle.set()

        timeout_s = self._config.request_timeout_s
        return SequenceStream(start, request, timeout_s, client, self._observer, opened, closed)
