"""Gathering independent requests into batches, the way Ray Serve's `@serve.batch` does.

One bounded queue of pending items, one future per item. A batch forms as soon as the model
has a free slot (`max_concurrent_batches`): its wait window opens when its oldest item arrived,
and it leaves when it is full or the window closes (a zero window is opportunistic batching:
take what is there). While the model computes, new items keep queueing, so the next batch is
usually full the moment a slot frees.

`infer(items)` is the whole path of one request, for the HTTP routes and for anything else:
admission (all of the request's items or none), and the wait for results, bounded by the
request's one deadline and its client (`waiting`). An abandoned or late request cancels its
futures, and the batcher drops cancelled items before they reach the model.

Where we differ from Ray: the queue is bounded (`QueueFull` -> 503), a request whose client
went away or whose deadline passed never reaches the model, shutdown drains instead of
relying on `__del__`, and the model runs off the event loop (the model layer's job).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from batchd.api.priority import (
    PriorityClass,
    PriorityClasses,
    PriorityError,
    UnknownPriorityClass,
    asked_class,
)
from batchd.api.spec import SHEDDABLE_SHARE, BatchingSpec
from batchd.replica import adaptive, errors
from batchd.replica.batch_deadline import (
    reset_batch_class,
    reset_batch_deadline,
    set_batch_class,
    set_batch_deadline,
)
from batchd.replica.errors import (
    BatchSizeMismatch,
    BatchWide,
    Displaced,
    Draining,
    InvalidInput,
    QueueFull,
    QueueTimedOut,
    Shed,
    TenantQueueFull,
    blamed_on,
)
from batchd.replica.queue_timeouts import QueueTimeouts
from batchd.replica.queueing import NO_CALLER, PendingQueue, fair_line
from batchd.replica.traces import (
    BatchTrace,
    BatchTracer,
    RequestTrace,
    reset_current_batch,
    set_current_batch,
)
from batchd.replica.waiting import NO_CLIENT, Client, Submitted, Watches, outcome

logger = logging.getLogger(__name__)

RunBatch = Callable[[list[Any]], Awaitable[Sequence[Any]]]
# allow_small_batch: false holds a partial batch until its oldest item has this fraction of
# request_timeout_s left (or twice the recent batch time, if longer): late enough to wait for a
# full batch as long as is safe, early enough that the model still answers within the deadline.
SMALL_BATCH_RESERVE = 0.1


class ClassObserver(Protocol):
    """Where the batcher and token-level generation report what each priority class was served
    and refused; the metrics module implements it."""

    def class_refused(self, priority_class: str, reason: str, items: int) -> None: ...

    def class_served(self, priority_class: str, caller: str, waited_s: float) -> None: ...


class BatchObserver(ClassObserver, Protocol):
    """Where the batcher reports what it did; the metrics module implements it."""

    def batch_dispatched(self, size: int, waited_s: float) -> None: ...

    def batch_finished(self, size: int, duration_s: float, failed: bool) -> None: ...

    def batch_isolated(self, extra_calls: int, failed_items: int) -> None: ...

    def batch_planned(self, size: int, go: bool) -> None: ...

    def objective_checked(self, items: int, late: int) -> None: ...


class NullBatchObserver:
    """Reports nowhere: a batcher without metrics (tests, tools)."""

    def batch_dispatched(self, size: int, waited_s: float) -> None:
        pass

    def batch_finished(self, size: int, duration_s: float, failed: bool) -> None:
        pass

    def batch_isolated(self, extra_calls: int, failed_items: int) -> None:
        pass

    def batch_planned(self, size: int, go: bool) -> None:
        pass

    def objective_checked(self, items: int, late: int) -> None:
        pass

    def class_refused(self, priority_class: str, reason: str, items: int) -> None:
        pass

    def class_served(self, priority_class: str, caller: str, waited_s: float) -> None:
        pass


@dataclass(eq=False, slots=True)
class _Pending:
    item: Any
    future: asyncio.Future[Any]
    arrived_at: float  # loop.time()
    deadline: float  # loop.time() when its request stops waiting (`waiting`)
    priority_class: str = ""
    sender: str = ""  # the caller its request names (its calls carry it on)
    caller: str = ""  # the queue's: its line (the sender, or "" without fair_share)
    counted_in: Any = None  # the queue's: where it counts while it waits alive
    trace: RequestTrace | None = None  # its request's span, where the replica traces

    def abandoned(self) -> bool:
        return self.future.done()


def class_of(classes: PriorityClasses, client: Client) -> tuple[PriorityClass, str]:
    """The class a request's client names (`batchd.api.priority`, as the router reads them) and
    the line it waits in within it (`queueing.fair_line`); UnknownPriorityClass (a 400 naming it
    and the classes there are) when the deployment has no class of that name."""
    try:
        found, caller = asked_class(classes, client.priority, client.caller, composed=client.composed)
    except UnknownPriorityClass as error:
        raise errors.UnknownPriorityClass(str(error)) from None
    except PriorityError as error:
        raise InvalidInput(str(error)) from None
    return found, fair_line(client.tenant, caller)


def over_share(
    queue: PendingQueue[Any], client: Client, count: int, retry_after_s: float
) -> TenantQueueFull | None:
    """TenantQueueFull when `count` more items would put the client's tenant past its share of
    the queue (`Client.queue_items`), before any other item's place is taken for them."""
    share = client.queue_items
    if share is None or queue.waiting_of(client.tenant) + count <= share:
        return None
    return TenantQueueFull(client.tenant, share, retry_after_s)


def first_come(config: BatchingSpec) -> bool:
    return config.queue_order == "first_come"


def refusal(
    queue: PendingQueue[Any],
    priority_class: PriorityClass,
    count: int,
    bound: int,
    retry_after_s: float,
    queued: int | None = None,
) -> QueueFull:
    """Why `count` items of `priority_class` find no room in `queue` (`queued` items waiting in it,
    by default all it counts): Shed for a sheddable class at or past its share of the bound, else
    QueueFull."""
    queued = len(queue) if queued is None else queued
    mark = math.floor(bound * SHEDDABLE_SHARE)
    if priority_class.sheddable and not queue.first_come and queued >= mark:
        return Shed(priority_class.name, mark, retry_after_s)
    return QueueFull(count, max(0, bound - queued), retry_after_s)


class _DrainRate:
    """Recent batch sizes and durations, for a Retry-After that reflects how fast the queue drains."""

    def __init__(self) -> None:
        self.batch_seconds = 0.0
        self.batch_items = 0.0
        self.batches = 0

    def record(self, size: int, duration_s: float) -> None:
        self.batches += 1
        weight = 0.2 if self.batches > 1 else 1.0
        self.batch_seconds += weight * (duration_s - self.batch_seconds)
        self.batch_items += weight * (size - self.batch_items)

    def seconds_to_serve(self, items: int) -> float:
        if self.batches == 0 or self.batch_items <= 0:
            return 1.0
        return max(1.0, items / max(self.batch_items, 1.0) * self.batch_seconds)


class Batcher:
    """Turns `infer(items)` calls from many requests into `run_batch(batch)` calls on the model."""

    def __init__(
        self, config: BatchingSpec, observer: BatchObserver | None = None, tracer: BatchTracer | None = None
    ) -> None:
        self._config = config
        self._observer: BatchObserver = observer or NullBatchObserver()
        self._tracer = tracer  # None: untraced, and nothing per batch is spent on it
        self._run_batch: RunBatch | None = None
        self._running_items = 0  # items inside batches the model is computing now
        self._running_sheddable = 0  # of those, the items of sheddable classes
        self._slot_freed = asyncio.Event()
        self._classes = PriorityClasses.of(config)
        self._queue: PendingQueue[_Pending] = PendingQueue(self._classes.classes, first_come(config))
        self._timeouts: QueueTimeouts[_Pending] = QueueTimeouts(self._queue_timed_out)
        self._arrived = asyncio.Event()
        # The former waits for a first item (no window open): every arrival must wake it.
        self._awaiting_first = False
        self._running: dict[asyncio.Task[None], float] = {}  # each running batch: when it started
        self._former: asyncio.Task[None] | None = None
        self._draining = False
        self._rate = _DrainRate()
        self._watches = Watches()
        # Learned as batches run, for adaptive batching (`latency_objective_s`).
        self.cost = adaptive.CostModel()
        self.arrivals = adaptive.ArrivalRate()

    # -- state -----------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def sheddable_items(self) -> int:
        """Items of sheddable classes, queued alive or in the model (autoscaling leaves them out
        unless its spec counts them)."""
        return self._queue.sheddable_live + self._running_sheddable

    def class_depths(self) -> list[tuple[str, int]]:
        """Items waiting alive, by priority class."""
        return self._queue.depths()

    @property
    def running_items(self) -> int:
        return self._running_items

    @property
    def longest_running_s(self) -> float:
        """How long the oldest batch still in the model has been running (0 when none is)."""
        if not self._running:
            return 0.0
        return time.monotonic() - min(self._running.values())

    @property
    def config(self) -> BatchingSpec:
        return self._config

    @property
    def draining(self) -> bool:
        """True from the first shutdown signal on: nothing new is admitted, accepted work finishes."""
        return self._draining

    # -- the path of one request -----------------------------------------------------------

    async def infer(self, items: Sequence[Any], client: Client = NO_CLIENT) -> list[Any]:
        """The results of one request's items, in order.

        Raises `Draining` or `QueueFull` (nothing was queued), `DeadlineExceeded` once the
        request's deadline has passed (`waiting`), `ClientDisconnected` when its client goes
        first, or the exception that failed the item's batch.
        """
        return await outcome(self.submit(items, client))

    def submit(self, items: Sequence[Any], client: Client = NO_CLIENT) -> Submitted:
        """Queue one request's items (all or none, as `infer`) and return at once: the caller
        awaits it (`outcome`) or adds a callback, and `close`s it once it has its results."""
        queued, deadline, late = self._admit(items, client)
        futures = [pending.future for pending in queued]
        waiter: asyncio.Future[Any] = futures[0] if len(futures) == 1 else asyncio.gather(*futures)
        submitted = self._watches.add(futures, waiter, deadline, client.gone, late)
        submitted.on_close = functools.partial(self._left, queued)
        return submitted

    def _admit(self, items: Sequence[Any], client: Client) -> tuple[list[_Pending], float, str]:
        """Queue every item of one request, or none of them: a request is never half-served.
        Returns the queued items, the request's deadline (loop time) and what set it."""
        if self._draining:
            raise Draining()
        priority_class, caller = class_of(self._classes, client)
        shared = over_share(self._queue, client, len(items), self._rate.seconds_to_serve(len(self._queue)))
        if shared is not None:
            raise shared
        self._make_room(priority_class, len(items))
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.arrivals.add(len(items), now)
        deadline, late = client.deadline(now, self._config.request_timeout_s)
        line = caller if self._config.fair_share else fair_line(client.tenant, NO_CALLER)
        name = priority_class.name
        queued = []
        for item in items:
            pending = _Pending(item, loop.create_future(), now, deadline, name, caller, trace=client.trace)
            self._queue.push(pending, name, line)
            queued.append(pending)
        if priority_class.queue_timeout_s is not None:
            for pending in queued:
                self._timeouts.add(pending, name, priority_class.queue_timeout_s, now)
        # A window that is open changes its mind only when the batch is full, or, with a latency
        # objective, at every arrival (it re-plans); waking the former for anything else costs a
        # task step per request and decides nothing.
        if (
            self._awaiting_first
            or len(self._queue) >= self._config.max_batch_size
            or self._config.latency_objective_s is not None
        ):
            self._arrived.set()
        return queued, deadline, late

    def _left(self, queued: list[_Pending]) -> None:
        """A request stopped waiting (answered, failed, gone, late): its items still queued no
        longer count (they are dropped when met)."""
        for pending in queued:
            self._queue.forget(pending)

    def _make_room(self, priority_class: PriorityClass, count: int) -> None:
        """Room for `count` items of `priority_class`, or QueueFull (Shed for a sheddable class)
        with nothing queued. Room made by taking lower classes' items fails their requests
        (`Displaced`)."""
        bound = self._config.max_queued_requests
        made = self._queue.room_for(priority_class.name, count, bound)
        if not made and made is not None:  # it fits as it is: the usual case, nothing more to do
            return
        retry_after_s = self._rate.seconds_to_serve(len(self._queue))
        if made is None:
            refused = refusal(self._queue, priority_class, count, bound, retry_after_s)
            reason = "shed" if isinstance(refused, Shed) else "queue_full"
            self._observer.class_refused(priority_class.name, reason, count)
            raise refused
        for pending, displaced_class in made:
            self._observer.class_refused(displaced_class.name, "displaced", 1)
            pending.future.set_exception(Displaced(displaced_class.name, priority_class.name, retry_after_s))

    def _queue_timed_out(self, pending: _Pending, timeout_s: float) -> None:
        """`pending`'s class limit in the queue passed: refused, if it still waits there."""
        if pending.counted_in is None or pending.future.done():
            return  # served, displaced or gone already
        self._queue.forget(pending)
        self._observer.class_refused(pending.priority_class, "queue_timeout", 1)
        retry_after_s = self._rate.seconds_to_serve(len(self._queue))
        pending.future.set_exception(QueueTimedOut(pending.priority_class, timeout_s, retry_after_s))

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, run_batch: RunBatch) -> None:
        """Begin forming batches for `run_batch` (once the model is loaded and warm)."""
        if self._former is None and not self._draining:
            self._run_batch = run_batch
            self._former = asyncio.create_task(self._form_batches(), name="batchd-batcher")

    def reconfigure(self, config: BatchingSpec) -> None:
        """Batch by `config` from the next batch on (live retuning).

        Nothing already accepted is touched: queued items stay queued (even above a lowered
        `max_queued_requests`), running batches finish, and each request keeps the deadline it
        was admitted with. A larger `max_concurrent_batches` takes effect at once.
        """
        classes = PriorityClasses.of(config)
        if classes.classes != self._queue.classes or first_come(config) != self._queue.first_come:
            self._queue = self._queue.regrouped(classes.classes, classes.default.name, first_come(config))
        self._classes = classes
        self._config = config
        self._slot_freed.set()
        self._arrived.set()  # a window that is open re-reads its size and length

    def begin_draining(self) -> None:
        """Admit nothing new from now on; what is queued still runs."""
        self._draining = True
        self._arrived.set()

    async def drain(self) -> None:
        """Admit nothing new, finish every item already accepted, then stop."""
        self.begin_draining()
        if self._former is not None:
            await self._former
            self._former = None
        self._timeouts.clear()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    # -- the batching loop -----------------------------------------------------------------

    async def _form_batches(self) -> None:
        while True:
            while len(self._running) >= self._config.max_concurrent_batches:
                self._slot_freed.clear()
                await self._slot_freed.wait()
            batch = await self._next_batch()
            if batch is None:  # drained and empty
                return
            task = asyncio.create_task(self._execute(batch, alone=not self._running))
            self._running[task] = time.monotonic()
            task.add_done_callback(self._batch_done)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        self._slot_freed.set()
        self._arrived.set()  # a batch forming may re-plan: the model has room now

    async def _next_batch(self) -> list[_Pending] | None:
        """Wait for the first live item, then for the window to close or the batch to fill."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._drop_dead_head():
                if self._draining:
                    return None
                self._arrived.clear()
                self._awaiting_first = True
                try:
                    await self._arrived.wait()
                finally:
                    self._awaiting_first = False

            while not self._draining and not self._full():
                if not self._drop_dead_head():
                    break  # everything in the window went away
                now = loop.time()
                remaining = self._partial_leaves_at(now) - now
                if remaining <= 0:
                    break
                self._arrived.clear()
                try:
                    async with asyncio.timeout(remaining):
                        await self._arrived.wait()
                except TimeoutError:
                    break

            batch = self._take_live(self._config.max_batch_size)
            if batch:  # else everything in the window went away: start over
                now = loop.time()
                self._observer.batch_dispatched(len(batch), now - batch[0].arrived_at)
                for pending in batch:
                    self._observer.class_served(
                        pending.priority_class, pending.caller, now - pending.arrived_at
                    )
                    if pending.trace is not None:
                        pending.trace.dispatched(
                            now - pending.arrived_at, pending.priority_class, pending.caller
                        )
                return batch

    def _full(self) -> bool:
        return len(self._queue) >= self._config.max_batch_size  # live items only

    def _partial_leaves_at(self, now: float) -> float:
        """When a batch that is not full leaves anyway (loop time): its window closes; with a
        `latency_objective_s`, when the adaptive plan says (at once when waiting cannot pay); or,
        with `allow_small_batch: false`, its oldest item's deadline is near, leaving that item the
        larger of a tenth of `request_timeout_s` and twice the recent batch time to be answered."""
        oldest_arrival = self._queue.oldest_arrival()
        objective_s = self._config.latency_objective_s
        if self._config.allow_small_batch and objective_s is not None:
            decision = adaptive.plan(
                now=now,
                queued=len(self._queue),
                oldest_arrival=oldest_arrival,
                objective_s=objective_s,
                max_batch_size=self._config.max_batch_size,
                running=len(self._running),
                cost=self.cost,
                rate=self.arrivals,
            )
            self._observer.batch_planned(decision.size, decision.go)
            return now if decision.go else decision.wait_until
        if self._config.allow_small_batch:
            return oldest_arrival + self._config.batch_wait_timeout_s
        reserve = max(SMALL_BATCH_RESERVE * self._config.request_timeout_s, 2 * self._rate.batch_seconds)
        first = self._queue.first()
        assert first is not None  # called with a live item first in line
        return first.deadline - reserve

    def _drop_dead_head(self) -> bool:
        """Drop abandoned items at the head of the queue; True when a live item is first in line."""
        return self._queue.drop_dead_first()

    def _take_live(self, limit: int) -> list[_Pending]:
        return self._queue.take_live(limit)

    async def _execute(self, batch: list[_Pending], alone: bool = True) -> None:
        """Run one batch; every future in it resolves, whatever happens. `alone`: no other batch
        ran when it left, so its time is what the model costs (beside another batch it may have
        waited for the device too, which would bend the cost line adaptive batching learns)."""
        started = time.perf_counter()
        failed = True
        span = self._batch_span(batch)
        token = set_current_batch(span) if span is not None else None
        error: BaseException | None = None
        sheddable = self._queue.sheddable
        shed_count = sum(1 for pending in batch if pending.priority_class in sheddable) if sheddable else 0
        self._running_items += len(batch)
        self._running_sheddable += shed_count
        try:
            await self._resolve(batch)
            failed = False
        except BaseException as raised:
            error = raised
            if not isinstance(raised, Exception):  # even a cancelled batch resolves its futures
                _fail(batch, Draining())
                raise
            logger.exception("batch of %d failed", len(batch))
            if not self._config.isolate_failures or isinstance(raised, BatchWide):
                _fail(batch, raised)
            elif len(batch) > 1:  # only the items that fail alone fail
                await self._isolate(batch, raised, span)
            else:  # a lone item is alone already
                _fail(batch, blamed_on(batch[0].item, raised))
        finally:
            self._running_items -= len(batch)
            self._running_sheddable -= shed_count
            duration = time.perf_counter() - started
            if span is not None:
                span.finished(duration, error)
                if token is not None:
                    reset_current_batch(token)
            self._rate.record(len(batch), duration)
            if not failed:
                if alone:
                    self.cost.observe(len(batch), duration)
                objective_s = self._config.latency_objective_s
                if objective_s is not None:
                    now = asyncio.get_running_loop().time()
                    late = sum(1 for pending in batch if now - pending.arrived_at > objective_s)
                    self._observer.objective_checked(len(batch), late)
            self._observer.batch_finished(len(batch), duration, failed)

    def _batch_span(self, batch: list[_Pending]) -> BatchTrace | None:
        """The batch's trace, linked to the recorded requests it carries; None untraced."""
        if self._tracer is None:
            return None
        traces = list({id(p.trace): p.trace for p in batch if p.trace is not None}.values())
        waited_s = asyncio.get_running_loop().time() - batch[0].arrived_at
        return self._tracer.batch_started(traces, len(batch), waited_s)

    async def _resolve(self, batch: list[_Pending]) -> None:
        """One model call for `batch`, its results set on the futures still waiting for them."""
        assert self._run_batch is not None
        # Code the model runs (handles to other deployments) waits no longer than the batch's
        # last request does (see `deadlines`).
        left = max(pending.deadline for pending in batch) - asyncio.get_running_loop().time()
        token = set_batch_deadline(time.monotonic() + left)
        asked = set_batch_class(functools.partial(self._batch_class, batch))
        try:
            results = await self._run_batch([pending.item for pending in batch])
        finally:
            reset_batch_class(asked)
            reset_batch_deadline(token)
        if len(results) != len(batch):
            raise BatchSizeMismatch(
                f"the model returned {len(results)} result(s) for a batch of {len(batch)}"
            )
        for pending, result in zip(batch, results, strict=True):
            if not pending.future.done():
                pending.future.set_result(result)

    def _batch_class(self, batch: list[_Pending]) -> tuple[str, str]:
        """The class a batch's calls to other deployments carry: the highest of its requests'
        (so that none of them waits behind the callee's lower classes), and the caller they
        share ("" when they are several)."""
        highest = batch[0]
        for pending in batch:
            found = self._classes.get(pending.priority_class)
            if found is not None and found.priority > self._priority(highest):
                highest = pending
        sender = highest.sender
        return highest.priority_class, sender if all(p.sender == sender for p in batch) else ""

    def _priority(self, pending: _Pending) -> int:
        found = self._classes.get(pending.priority_class)
        return found.priority if found is not None else 0

    async def _isolate(self, batch: list[_Pending], error: Exception, span: BatchTrace | None = None) -> None:
        """Find the items that fail alone, so that only they fail (`isolate_failures`).

        A failed group is split in halves and each half run again, down to single items; when
        the first half succeeds, the second must hold the failure and is split without running
        it whole. k bad items among n cost about 2k log2(n/k) extra calls, never more than 2n-2
        (every half of every half): every item that does not fail alone gets its answer.
        """
        budget = 2 * len(batch) - 2
        calls = 0

        async def probe(group: list[_Pending]) -> bool:
            """Run `group` again; True when it succeeded, else it is split to find who failed."""
            nonlocal budget, calls
            live = [pending for pending in group if not pending.future.done()]
            if not live:
                return True  # its clients left, or their deadlines passed: nothing to find out
            if budget <= 0:
                _fail(live, error)
                return False
            budget -= 1
            calls += 1
            try:
                await self._resolve(live)
                return True
            except Exception as group_error:
                await split(live, group_error)
                return False

        async def split(group: list[_Pending], group_error: Exception) -> None:
            if len(group) == 1:
                _fail(group, blamed_on(group[0].item, group_error))
                return
            if isinstance(group_error, BatchSizeMismatch):
                _fail(group, group_error)
                return
            left, right = group[: len(group) // 2], group[len(group) // 2 :]
            if await probe(left) and len(right) > 1:
                await split(right, group_error)
            else:
                await probe(right)

        try:
            await split(batch, error)
        finally:
            self._observer.batch_isolated(calls, sum(1 for pending in batch if _failed(pending.future)))
            if span is not None:
                span.isolated(calls)
            _fail(batch, error)  # anything a cancellation left undecided


def _failed(future: asyncio.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is not None


def _fail(batch: list[_Pending], error: Exception) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)
