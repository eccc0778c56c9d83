"""Token-level scheduling, the event loop's side: admission of sequences, and their streams fed by
the engine a token at a time. The model never runs on the loop: the loop only tokenizes a prompt
(to check it fits), hands the sequence to the engine, and moves chunks to the request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Literal

from batchd.api.spec import BatchingSpec
from batchd.replica.batching import first_come, lane_of, priority_classes
from batchd.replica.errors import Draining, QueueFull
from batchd.replica.generation.engine import GenerationEngine, SequenceState
from batchd.replica.generation.params import Completion, GenerationRequest
from batchd.replica.generation.prefix_cache import PrefixCache
from batchd.replica.generation.preparing import Preparer
from batchd.replica.generation.streams import Deliver, SequenceObserver, SequenceStream
from batchd.replica.queueing import NO_CALLER
from batchd.replica.waiting import NO_CLIENT, Client


class TokenLevel:
    """Sequences scheduled by the engine, a token at a time."""

    scheduling: Literal["token"] = "token"

    def __init__(
        self,
        engine: GenerationEngine,
        preparer: Preparer,
        config: BatchingSpec,
        observer: SequenceObserver | None = None,
        prefix_scope: str = "caller",
    ) -> None:
        self.engine = engine
        self._prefix_scope = prefix_scope  # model.generation.prefix_cache_scope
        self.preparer = preparer
        self._config = config
        self._observer = observer
        self._draining = False
        self._open = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._seconds_per_sequence = 1.0  # recent, for Retry-After
        self.reconfigure(config)

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
    def prefix_cache(self) -> PrefixCache:
        return self.engine.prefix_cache

    @property
    def longest_step_s(self) -> float:
        started = self.engine.step_started
        return 0.0 if started is None else time.monotonic() - started

    def open(self, request: GenerationRequest, client: Client = NO_CLIENT) -> SequenceStream:
        """Admit one sequence (or raise Draining, QueueFull or UnknownPriorityClass); iterate the
        stream inside `async with`."""
        lane = self._admit(1, client)
        return self._stream(request, client, lane)

    async def complete(
        self, requests: Sequence[GenerationRequest], client: Client = NO_CLIENT
    ) -> list[Completion]:
        """Whole answers for several prompts (one request's instances): all admitted, or none."""
        lane = self._admit(len(requests), client)
        streams = [self._stream(request, client, lane) for request in requests]

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
        self.engine.set_classes(priority_classes(config), config.default_priority_class, first_come(config))

    def begin_draining(self) -> None:
        self._draining = True

    async def drain(self) -> None:
        """Admit nothing new; let every admitted sequence finish; then stop the engine."""
        self.begin_draining()
        await self._idle.wait()
        await asyncio.to_thread(self.engine.stop)

    def _admit(self, count: int, client: Client) -> int:
        """Room for `count` sequences, or Draining, QueueFull or UnknownPriorityClass (a 400);
        returns the lane of the waiting queue they join."""
        if self._draining:
            raise Draining()
        lane = lane_of(self.engine.queue, self._config, client.priority)
        # A sequence waits only when no row is free: those the engine has yet to pick up for a
        # free row are not waiting behind anyone.
        free_rows = max(0, self.engine.max_running - self.engine.running)
        free = self._config.max_queued_requests + free_rows - self.engine.waiting
        if count > free:
            batches_ahead = self.engine.waiting / max(1, self._config.max_batch_size) + 1
            raise QueueFull(count, max(0, free), batches_ahead * self._seconds_per_sequence)
        return lane

    def _stream(self, request: GenerationRequest, client: Client, lane: int) -> SequenceStream:
        started = time.perf_counter()

        def opened() -> None:
            self._open += 1
            self._idle.clear()

        caller = client.caller if self._config.fair_share else NO_CALLER
        # Whose cached prefixes it may use: its caller's own (by the header), or the deployment's.
        salt = client.tenant if self._prefix_scope == "caller" else ""

        def start(deliver: Deliver) -> Callable[[], None]:
            sequence = SequenceState(
                request, deliver, lane=lane, caller=caller, salt=salt, trace=client.trace
            )
            self.engine.submit(sequence)
            return lambda: self.engine.cancel(sequence)

        def closed() -> None:
            self._seconds_per_sequence += 0.2 * (time.perf_counter() - started - self._seconds_per_sequence)
            self._open -= 1
            if self._open == 0:
                self._idle.set()

        timeout_s = self._config.request_timeout_s
        return SequenceStream(start, request, timeout_s, client, self._observer, opened, closed)
