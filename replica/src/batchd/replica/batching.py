"""Gathering independent requests into batches, the way Ray Serve's `@serve.batch` does.

One bounded queue of pending items, one future per item. A batch forms as soon as the model
has a free slot (`max_concurrent_batches`): its wait window opens when its oldest item arrived,
and it leaves when it is full or the window closes (a zero window is opportunistic batching:
take what is there). While the model computes, new items keep queueing, so the next batch is
usually full the moment a slot frees.

Where we differ from Ray: the queue is bounded (`QueueFull` -> 503), items whose client went
away or whose deadline passed are dropped before they reach the model, shutdown drains instead
of relying on `__del__`, and the model runs off the event loop (the model layer's job).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from batchd.api.spec import BatchingSpec

logger = logging.getLogger(__name__)

RunBatch = Callable[[list[Any]], Awaitable[Sequence[Any]]]


class QueueFull(Exception):
    """The queue cannot take the request's items; the client should retry later."""

    def __init__(self, requested: int, free: int, retry_after_s: float) -> None:
        super().__init__(f"queue full: {requested} item(s) asked for, {free} place(s) free")
        self.retry_after_s = retry_after_s


class Draining(Exception):
    """The replica is shutting down and admits no new work."""


class BatchSizeMismatch(ValueError):
    """The model returned a different number of results than it was given items."""


class DeadlineExceeded(Exception):
    """The item's request deadline passed before the model reached it."""


class BatchObserver(Protocol):
    """Where the batcher reports what it did; the metrics module implements it."""

    def batch_dispatched(self, size: int, waited_s: float) -> None: ...

    def batch_finished(self, size: int, duration_s: float, failed: bool) -> None: ...


class _NoObserver:
    def batch_dispatched(self, size: int, waited_s: float) -> None:
        pass

    def batch_finished(self, size: int, duration_s: float, failed: bool) -> None:
        pass


@dataclass(eq=False, slots=True)
class _Pending:
    item: Any
    future: asyncio.Future[Any]
    arrived_at: float  # loop.time()
    deadline: float  # loop.time()


@dataclass
class _Stats:
    """Running averages used to suggest a Retry-After that reflects how fast the queue drains."""

    batch_seconds: float = 0.0
    batch_items: float = 0.0
    batches: int = field(default=0)

    def record(self, size: int, duration_s: float) -> None:
        self.batches += 1
        weight = 0.2 if self.batches > 1 else 1.0
        self.batch_seconds += weight * (duration_s - self.batch_seconds)
        self.batch_items += weight * (size - self.batch_items)


class Batcher:
    """Turns `submit(items)` calls from many requests into `run_batch(batch)` calls on the model."""

    def __init__(self, run_batch: RunBatch, config: BatchingSpec, observer: BatchObserver | None = None):
        self._run_batch = run_batch
        self._max_batch_size = config.max_batch_size
        self._wait_s = config.batch_wait_timeout_s
        self._max_queued = config.max_queued_requests
        self._timeout_s = config.request_timeout_s
        self._observer: BatchObserver = observer or _NoObserver()
        self._slots = asyncio.Semaphore(config.max_concurrent_batches)
        self._queue: collections.deque[_Pending] = collections.deque()
        self._arrived = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._former: asyncio.Task[None] | None = None
        self._draining = False
        self._stats = _Stats()

    # -- what the routes call --------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def draining(self) -> bool:
        return self._draining

    def submit(self, items: Sequence[Any]) -> list[asyncio.Future[Any]]:
        """Queue every item of one request, or none of them; one future per item.

        Admission is all-or-nothing so that a request is never half-served. The futures
        resolve with the item's result, or with the exception that failed its batch.
        """
        if self._draining:
            raise Draining("the replica is shutting down")
        free = self._max_queued - len(self._queue)
        if len(items) > free:
            raise QueueFull(len(items), free, self._retry_after_s())
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + self._timeout_s
        futures = []
        for item in items:
            future = loop.create_future()
            self._queue.append(_Pending(item, future, now, deadline))
            futures.append(future)
        self._arrived.set()
        return futures

    async def call(self, items: Sequence[Any]) -> list[Any]:
        """Submit, then wait for every result within `request_timeout_s` (or raise TimeoutError)."""
        futures = self.submit(items)
        try:
            async with asyncio.timeout(self._timeout_s):
                return list(await asyncio.gather(*futures))
        finally:
            # A client that left or timed out: its items are dropped if they have not run yet.
            for future in futures:
                future.cancel()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._former is None:
            self._former = asyncio.create_task(self._form_batches(), name="batchd-batcher")

    async def drain(self) -> None:
        """Admit nothing new, finish every item already accepted, then stop."""
        self._draining = True
        self._arrived.set()
        if self._former is not None:
            await self._former
            self._former = None
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    # -- the batching loop -----------------------------------------------------------------

    async def _form_batches(self) -> None:
        while True:
            await self._slots.acquire()
            batch = await self._next_batch()
            if batch is None:  # drained and empty
                self._slots.release()
                return
            task = asyncio.create_task(self._execute(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _next_batch(self) -> list[_Pending] | None:
        """Wait for the first live item, then for the window to close or the batch to fill."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._drop_dead_head(loop.time()):
                if self._draining:
                    return None
                self._arrived.clear()
                await self._arrived.wait()

            window_closes = self._queue[0].arrived_at + self._wait_s
            while len(self._queue) < self._max_batch_size and not self._draining:
                remaining = window_closes - loop.time()
                if remaining <= 0:
                    break
                self._arrived.clear()
                try:
                    async with asyncio.timeout(remaining):
                        await self._arrived.wait()
                except TimeoutError:
                    break

            now = loop.time()
            batch = self._take_live(now, self._max_batch_size)
            if batch:  # else everything in the window went away: start over
                self._observer.batch_dispatched(len(batch), now - batch[0].arrived_at)
                return batch

    def _drop_dead_head(self, now: float) -> bool:
        """Drop dead items at the head of the queue; True when a live item is first in line."""
        while self._queue:
            if self._is_alive(self._queue[0], now):
                return True
            self._queue.popleft()
        return False

    def _take_live(self, now: float, limit: int) -> list[_Pending]:
        batch: list[_Pending] = []
        while self._queue and len(batch) < limit:
            pending = self._queue.popleft()
            if self._is_alive(pending, now):
                batch.append(pending)
        return batch

    @staticmethod
    def _is_alive(pending: _Pending, now: float) -> bool:
        """False for items whose client left, or whose deadline passed (those are failed here)."""
        if pending.future.done():
            return False
        if pending.deadline <= now:
            pending.future.set_exception(DeadlineExceeded("request_timeout_s passed while queued"))
            return False
        return True

    async def _execute(self, batch: list[_Pending]) -> None:
        """Run one batch; every future in it resolves, whatever happens."""
        started = time.perf_counter()
        failed = True
        try:
            results = await self._run_batch([pending.item for pending in batch])
            if len(results) != len(batch):
                raise BatchSizeMismatch(
                    f"the model returned {len(results)} result(s) for a batch of {len(batch)}"
                )
            for pending, result in zip(batch, results, strict=True):
                if not pending.future.done():
                    pending.future.set_result(result)
            failed = False
        except BaseException as error:
            # Even a cancelled batch resolves its futures: no request is left hanging.
            if isinstance(error, Exception):
                logger.exception("batch of %d failed", len(batch))
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(error if isinstance(error, Exception) else Draining())
            if not isinstance(error, Exception):
                raise
        finally:
            duration = time.perf_counter() - started
            self._stats.record(len(batch), duration)
            self._observer.batch_finished(len(batch), duration, failed)
            self._slots.release()

    def _retry_after_s(self) -> float:
        """How long the current queue should take to drain, at the recent batch rate."""
        if self._stats.batches == 0 or self._stats.batch_items <= 0:
            return 1.0
        batches_ahead = len(self._queue) / max(self._stats.batch_items, 1.0)
        return max(1.0, batches_ahead * self._stats.batch_seconds)
