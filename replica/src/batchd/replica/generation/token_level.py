"""Token-level scheduling, the event loop's side: admission of sequences, and their streams fed by
the engine a token at a time. The model never runs on the loop: the loop only tokenizes a prompt
(to check it fits), hands the sequence to the engine, and moves chunks to the request.

Sequences are admitted as the batcher admits items (`queueing`): at most `max_queued_requests`
wait for a row (besides those a free row takes at once), a higher priority level makes room by
taking the place of the most recently queued sequence of the lowest level below it (503 with
Retry-After), a sheddable class is admitted only while less than half of that bound waits, a
class's `queue_timeout_s` refuses a sequence still waiting after it, and every refusal is counted
by class. Which sequence runs, and which one is paused for a higher level, is the engine's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Literal

from batchd.api.priority import PriorityClass, PriorityClasses
from batchd.api.spec import BatchingSpec
from batchd.replica.batching import (
    ClassObserver,
    NullBatchObserver,
    class_of,
    first_come,
    over_share,
    refusal,
)
from batchd.replica.errors import Displaced, Draining, QueueTimedOut, Shed
from batchd.replica.generation.engine import GenerationEngine, SequenceState
from batchd.replica.generation.params import Completion, GenerationRequest
from batchd.replica.generation.prefix_cache import PrefixCache
from batchd.replica.generation.preparing import Preparer
from batchd.replica.generation.streams import Deliver, SequenceObserver, SequenceStream
from batchd.replica.queue_timeouts import QueueTimeouts
from batchd.replica.queueing import NO_CALLER, fair_line
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
        classes_observer: ClassObserver | None = None,
        prefix_scope: str = "caller",
    ) -> None:
        self.engine = engine
        self._prefix_scope = prefix_scope  # model.generation.prefix_cache_scope
        self.preparer = preparer
        self._config = config
        self._observer = observer
        self._classes_observer: ClassObserver = classes_observer or NullBatchObserver()
        engine.classes_observer = self._classes_observer
        self._classes = PriorityClasses.of(config)
        self._timeouts: QueueTimeouts[SequenceState] = QueueTimeouts(self._queue_timed_out)
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
    def sheddable(self) -> int:
        """Sequences of sheddable classes, waiting or running (autoscaling leaves them out)."""
        return self.engine.sheddable

    def class_depths(self) -> list[tuple[str, int]]:
        """Sequences waiting alive, by priority class."""
        return self.engine.depths()

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
        """Admit one sequence (or raise Draining, QueueFull, Shed or UnknownPriorityClass);
        iterate the stream inside `async with`."""
        asked = self._admit(1, client)
        return self._stream(request, client, asked)

    async def complete(
        self, requests: Sequence[GenerationRequest], client: Client = NO_CLIENT
    ) -> list[Completion]:
        """Whole answers for several prompts (one request's instances): all admitted, or none."""
        asked = self._admit(len(requests), client)
        streams = [self._stream(request, client, asked) for request in requests]

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
        self._classes = PriorityClasses.of(config)
        self.engine.set_max_running(config.max_batch_size)
        self.engine.set_classes(self._classes.classes, self._classes.default.name, first_come(config))

    def begin_draining(self) -> None:
        self._draining = True

    async def drain(self) -> None:
        """Admit nothing new; let every admitted sequence finish; then stop the engine."""
        self.begin_draining()
        await self._idle.wait()
        self._timeouts.clear()
        await asyncio.to_thread(self.engine.stop)

    def _admit(self, count: int, client: Client) -> tuple[PriorityClass, str]:
        """Room for `count` sequences, or Draining, QueueFull, Shed or UnknownPriorityClass (a
        400); the class and caller they wait as. Room made by taking lower levels' places fails
        their requests (`Displaced`)."""
        if self._draining:
            raise Draining()
        priority_class, caller = class_of(self._classes, client)
        shared = over_share(self.engine.queue, client, count, self._retry_after_s())
        if shared is not None:
            raise shared
        bound = self._config.max_queued_requests
        # A sequence waits only when no row is free: those a free row takes are behind no one.
        made, queued = self.engine.make_room(priority_class.name, count, bound)
        if made is None:
            refused = refusal(self.engine.queue, priority_class, count, bound, self._retry_after_s(), queued)
            reason = "shed" if isinstance(refused, Shed) else "queue_full"
            self._classes_observer.class_refused(priority_class.name, reason, count)
            raise refused
        for displaced, displaced_class in made:
            self._classes_observer.class_refused(displaced_class.name, "displaced", 1)
            displaced.deliver(Displaced(displaced_class.name, priority_class.name, self._retry_after_s()))
        return priority_class, caller if self._config.fair_share else fair_line(client.tenant, NO_CALLER)

    def _retry_after_s(self) -> float:
        """About when the sequences waiting now have had their rows."""
        batches_ahead = self.engine.waiting / max(1, self._config.max_batch_size) + 1
        return batches_ahead * self._seconds_per_sequence

    def _queue_timed_out(self, sequence: SequenceState, timeout_s: float) -> None:
        """`sequence`'s class limit in the queue passed: refused, if it still waits for its first row."""
        if self.engine.withdraw(sequence):
            self._classes_observer.class_refused(sequence.priority_class, "queue_timeout", 1)
            sequence.deliver(QueueTimedOut(sequence.priority_class, timeout_s, self._retry_after_s()))

    def _stream(
        self, request: GenerationRequest, client: Client, asked: tuple[PriorityClass, str]
    ) -> SequenceStream:
        started = time.perf_counter()
        priority_class, caller = asked

        def opened() -> None:
            self._open += 1
            self._idle.clear()

        # Whose cached prefixes it may use: its tenant's (as the router signed it), or the deployment's.
        salt = client.tenant if self._prefix_scope == "caller" else ""

        def start(deliver: Deliver) -> Callable[[], None]:
            sequence = SequenceState(
                request,
                deliver,
                priority_class=priority_class.name,
                priority=priority_class.priority,
                caller=caller,
                salt=salt,
                trace=client.trace,
            )
            self.engine.submit(sequence)
            timeout_s = priority_class.queue_timeout_s
            if timeout_s is not None:
                loop = asyncio.get_running_loop()
                self._timeouts.add(sequence, priority_class.name, timeout_s, loop.time())
            return lambda: self.engine.cancel(sequence)

        def closed() -> None:
            self._seconds_per_sequence += 0.2 * (time.perf_counter() - started - self._seconds_per_sequence)
            self._open -= 1
            if self._open == 0:
                self._idle.set()

        timeout_s = self._config.request_timeout_s
        return SequenceStream(start, request, timeout_s, client, self._observer, opened, closed)
