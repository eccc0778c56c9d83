"""The batcher on its own, with a recording model: how batches form, and that every item is answered."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from batchd.api.spec import BatchingSpec
from batchd.replica.batching import Batcher, NullBatchObserver
from batchd.replica.errors import (
    BatchSizeMismatch,
    CalleeUnavailable,
    ClientDisconnected,
    DeadlineExceeded,
    Draining,
    ItemFailed,
    QueueFull,
)
from batchd.replica.waiting import Client


class RecordingModel:
    """Adds one to each item; records every batch; can be held at a gate to keep batches in flight."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.running = 0
        self.most_running = 0
        self.started = asyncio.Event()

    async def __call__(self, items: list[Any]) -> Sequence[Any]:
        self.batches.append(list(items))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        self.started.set()
        try:
            await self.gate.wait()
            if any(item == "boom" for item in items):
                raise RuntimeError("model failed on this batch")
            return [item + 1 if isinstance(item, int) else item for item in items]
        finally:
            self.running -= 1


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll a condition with a bound (no sleeping as synchronisation)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


async def occupied(model: RecordingModel, batcher: Batcher) -> asyncio.Future[list[Any]]:
    """A request whose batch holds the model at its gate, so that whatever follows must queue."""
    model.gate.clear()
    busy = asyncio.ensure_future(batcher.infer([0]))
    await until(lambda: model.running == 1)
    return busy


def make(model: Callable[[list[Any]], Awaitable[Sequence[Any]]], **config: Any) -> Batcher:
    batcher = Batcher(BatchingSpec(**config))
    batcher.start(model)
    return batcher


async def test_concurrent_requests_form_batches_never_larger_than_max() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=4, batch_wait_timeout_s=0.05)
    results = await asyncio.gather(*(batcher.infer([n]) for n in range(10)))
    assert [r[0] for r in results] == [n + 1 for n in range(10)]
    assert [len(b) for b in model.batches] == [4, 4, 2]
    assert sorted(item for batch in model.batches for item in batch) == list(range(10))
    await batcher.drain()


async def test_first_batch_of_one_then_full_batches_as_in_the_tutorial() -> None:
    # Opportunistic batching: the first query runs alone; the others queue meanwhile and fill batches.
    model = RecordingModel()
    model.gate.clear()
    batcher = make(model, max_batch_size=4, batch_wait_timeout_s=0)
    first = asyncio.ensure_future(batcher.infer([0]))
    await until(lambda: model.batches == [[0]])
    rest = [asyncio.ensure_future(batcher.infer([n])) for n in range(1, 9)]
    await until(lambda: batcher.queue_depth == 8)
    model.gate.set()
    await asyncio.gather(first, *rest)
    assert [len(b) for b in model.batches] == [1, 4, 4]
    await batcher.drain()


async def test_wait_window_holds_a_partial_batch_until_it_closes() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=8, batch_wait_timeout_s=0.3)
    loop = asyncio.get_running_loop()
    first = asyncio.ensure_future(batcher.infer([1]))
    await until(lambda: batcher.queue_depth == 1)
    opened = loop.time()
    second = asyncio.ensure_future(batcher.infer([2]))
    await asyncio.gather(first, second)
    waited = loop.time() - opened
    assert model.batches == [[1, 2]]  # the second item joined the first one's window
    assert waited >= 0.25  # ... which stayed open for its full length, the batch being partial
    await batcher.drain()


async def test_full_batch_leaves_before_the_window_closes() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=2, batch_wait_timeout_s=30)
    results = await asyncio.wait_for(asyncio.gather(batcher.infer([1]), batcher.infer([2])), timeout=5)
    assert list(results) == [[2], [3]]
    await batcher.drain()


async def test_opportunistic_mode_does_not_wait_for_company() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=32, batch_wait_timeout_s=0)
    assert await asyncio.wait_for(batcher.infer([5]), timeout=1) == [6]
    assert model.batches == [[5]]
    await batcher.drain()


async def test_concurrent_batches_run_together_up_to_the_limit() -> None:
    model = RecordingModel()
    model.gate.clear()
    batcher = make(model, max_batch_size=1, batch_wait_timeout_s=0, max_concurrent_batches=3)
    calls = [asyncio.ensure_future(batcher.infer([n])) for n in range(5)]
    await until(lambda: model.running == 3)
    assert batcher.queue_depth == 2  # the rest wait for a free slot
    model.gate.set()
    await asyncio.gather(*calls)
    assert model.most_running == 3
    await batcher.drain()


async def test_cancelled_items_never_reach_the_model() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=4, batch_wait_timeout_s=0)
    busy = await occupied(model, batcher)
    gone = asyncio.ensure_future(batcher.infer([100]))
    kept = asyncio.ensure_future(batcher.infer([1]))
    await until(lambda: batcher.queue_depth == 2)
    gone.cancel()  # the client went away while its item waited
    model.gate.set()
    assert await kept == [2]
    await busy
    assert 100 not in [item for batch in model.batches for item in batch]
    await batcher.drain()


async def test_an_abandoned_request_is_dropped_before_the_model() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=4, batch_wait_timeout_s=0)
    busy = await occupied(model, batcher)
    client_left = asyncio.Event()
    gone = asyncio.ensure_future(batcher.infer([100], Client(gone=client_left.wait)))
    await until(lambda: batcher.queue_depth == 1)
    client_left.set()  # noticed once the request has waited WATCH_AFTER_S
    with pytest.raises(ClientDisconnected):
        await gone
    model.gate.set()
    await busy
    assert await batcher.infer([1]) == [2]
    assert 100 not in [item for batch in model.batches for item in batch]
    await batcher.drain()


async def test_items_past_their_deadline_time_out_without_running() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=1, batch_wait_timeout_s=0, request_timeout_s=0.2)
    stuck = await occupied(model, batcher)
    late = asyncio.ensure_future(batcher.infer([1]))
    with pytest.raises(DeadlineExceeded):
        await late
    with pytest.raises(DeadlineExceeded):  # running, but its answer came too late: the same error
        await stuck
    model.gate.set()
    await until(lambda: model.running == 0)
    await batcher.drain()
    assert model.batches == [[0]]  # the late item was dropped before the model


async def test_without_isolation_a_failing_batch_fails_only_its_own_items() -> None:
    model = RecordingModel()
    model.gate.clear()
    batcher = make(model, max_batch_size=2, batch_wait_timeout_s=0, isolate_failures=False)
    first = asyncio.ensure_future(batcher.infer([1]))
    await until(lambda: model.running == 1)
    doomed = [asyncio.ensure_future(batcher.infer(["boom"])), asyncio.ensure_future(batcher.infer([2]))]
    await until(lambda: batcher.queue_depth == 2)
    model.gate.set()
    assert await first == [2]
    outcomes = await asyncio.gather(*doomed, return_exceptions=True)
    assert all(isinstance(o, RuntimeError) for o in outcomes)
    # The batcher is still alive and the next batch succeeds.
    assert await batcher.infer([3]) == [4]
    await batcher.drain()


class CountingObserver(NullBatchObserver):
    def __init__(self) -> None:
        self.isolated: list[tuple[int, int]] = []

    def batch_dispatched(self, size: int, waited_s: float) -> None:
        pass

    def batch_finished(self, size: int, duration_s: float, failed: bool) -> None:
        pass

    def batch_isolated(self, extra_calls: int, failed_items: int) -> None:
        self.isolated.append((extra_calls, failed_items))


async def test_isolation_fails_only_the_items_that_fail_alone() -> None:
    model = RecordingModel()
    observer = CountingObserver()
    batcher = Batcher(BatchingSpec(max_batch_size=8, batch_wait_timeout_s=1), observer)
    batcher.start(model)
    items: list[Any] = [0, 1, "boom", 3, 4, "boom", 6, 7]  # a full batch with two poisoned items
    outcomes = await asyncio.gather(*(batcher.infer([item]) for item in items), return_exceptions=True)
    for item, outcome in zip(items, outcomes, strict=True):
        if item == "boom":  # the client's fault: the answer names the item and the model's error
            assert isinstance(outcome, ItemFailed)
            assert "item 'boom' alone: RuntimeError: model failed on this batch" in str(outcome)
        else:
            assert outcome == [item + 1]
    ((extra_calls, failed_items),) = observer.isolated
    assert failed_items == 2 and extra_calls == len(model.batches) - 1 <= 2 * 2 * 2 + 1  # ~2k log2(n/k)
    assert [len(batch) for batch in model.batches][:3] == [8, 4, 2]  # halves, then halves again
    await batcher.drain()


async def test_isolation_is_bounded_when_everything_fails() -> None:
    model = RecordingModel()
    observer = CountingObserver()
    batcher = Batcher(BatchingSpec(max_batch_size=16, batch_wait_timeout_s=1), observer)
    batcher.start(model)
    outcomes = await asyncio.gather(*(batcher.infer(["boom"]) for _ in range(16)), return_exceptions=True)
    assert all(isinstance(outcome, ItemFailed) for outcome in outcomes)  # each one tried alone
    ((extra_calls, failed_items),) = observer.isolated
    assert extra_calls <= 2 * 16 - 2 and failed_items == 16
    await batcher.drain()


async def test_a_lone_item_that_fails_is_the_clients_fault_unless_the_failure_is_batch_wide() -> None:
    async def model(items: list[Any]) -> list[Any]:
        if items == ["callee"]:
            raise CalleeUnavailable("nothing answered", alias="a", deployment="a")
        return [item + 1 for item in items]

    batcher = make(model, max_batch_size=4, batch_wait_timeout_s=0)
    with pytest.raises(ItemFailed, match="item 'text' alone: TypeError"):
        await batcher.infer(["text"])
    with pytest.raises(CalleeUnavailable):
        await batcher.infer(["callee"])
    assert await batcher.infer([1]) == [2]
    await batcher.drain()


async def test_a_model_returning_the_wrong_number_of_results_gets_a_clear_error() -> None:
    async def short(items: list[Any]) -> list[Any]:
        return items[:-1]

    batcher = make(short, max_batch_size=4, batch_wait_timeout_s=0.05)
    outcomes = await asyncio.gather(batcher.infer([1]), batcher.infer([2]), return_exceptions=True)
    assert all(isinstance(o, BatchSizeMismatch) for o in outcomes)
    assert "returned 1 result(s) for a batch of 2" in str(outcomes[0])
    await batcher.drain()


async def test_a_full_queue_refuses_whole_requests_and_keeps_what_it_accepted() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=1, batch_wait_timeout_s=0, max_queued_requests=3)
    busy = await occupied(model, batcher)
    accepted = asyncio.ensure_future(batcher.infer([1, 2]))
    await until(lambda: batcher.queue_depth == 2)
    with pytest.raises(QueueFull) as refused:
        await batcher.infer([3, 4])  # two items, one place: nothing of it is queued
    assert refused.value.retry_after_s >= 1
    assert batcher.queue_depth == 2
    model.gate.set()
    assert await accepted == [2, 3]
    await busy
    await batcher.drain()


async def test_drain_finishes_accepted_items_and_refuses_new_ones() -> None:
    model = RecordingModel()
    model.gate.clear()
    batcher = make(model, max_batch_size=2, batch_wait_timeout_s=10)
    accepted = [asyncio.ensure_future(batcher.infer([n])) for n in range(5)]
    await until(lambda: model.running == 1)
    draining = asyncio.ensure_future(batcher.drain())
    await until(lambda: batcher.draining)
    assert batcher.queue_depth == 3 and not draining.done()
    with pytest.raises(Draining):
        await batcher.infer([99])
    model.gate.set()
    await asyncio.wait_for(draining, timeout=5)  # no 10 s windows while draining
    assert [r[0] for r in await asyncio.gather(*accepted)] == [1, 2, 3, 4, 5]


async def test_a_new_configuration_applies_from_the_next_batch_and_keeps_accepted_deadlines() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=2, batch_wait_timeout_s=0, request_timeout_s=0.3)
    busy = await occupied(model, batcher)
    early = [asyncio.ensure_future(batcher.infer([n])) for n in range(1, 5)]
    await until(lambda: batcher.queue_depth == 4)
    batcher.reconfigure(BatchingSpec(max_batch_size=8, batch_wait_timeout_s=0, request_timeout_s=30))
    late = asyncio.ensure_future(batcher.infer([9]))
    # The items accepted before keep the 0.3 s they were admitted with; the new one gets 30 s.
    for request in early:
        with pytest.raises(DeadlineExceeded):
            await request
    with pytest.raises(DeadlineExceeded):  # in the model, but under the old deadline too
        await busy
    model.gate.set()
    assert await late == [10]
    assert model.batches[-1] == [9]  # the early items never ran: their clients had their answer
    batcher.reconfigure(BatchingSpec(max_batch_size=8, batch_wait_timeout_s=0.05))
    results = await asyncio.gather(*(batcher.infer([n]) for n in range(6)))
    assert [r[0] for r in results] == [1, 2, 3, 4, 5, 6]
    assert model.batches[-1] == [0, 1, 2, 3, 4, 5]  # one batch of six: larger than the first limit
    await batcher.drain()


async def test_more_concurrent_batches_take_effect_at_once() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=1, batch_wait_timeout_s=0, max_concurrent_batches=1)
    busy = await occupied(model, batcher)
    waiting = [asyncio.ensure_future(batcher.infer([n])) for n in (1, 2)]
    await until(lambda: batcher.queue_depth == 2)
    batcher.reconfigure(BatchingSpec(max_batch_size=1, batch_wait_timeout_s=0, max_concurrent_batches=3))
    await until(lambda: model.running == 3)
    model.gate.set()
    await asyncio.gather(busy, *waiting)
    await batcher.drain()


class CostlyModel:
    """Each batch takes 20 ms plus 1 ms an item, as a model on an accelerator might."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append(len(items))
        await asyncio.sleep(0.020 + 0.001 * len(items))
        return items


async def open_loop(batcher: Batcher, rate: float, seconds: float) -> list[tuple[float, float]]:
    """Requests at `rate` a second for `seconds`; every request's latency, and how much of it
    the event loop itself was held up (a busy machine descheduling this process): time no
    batching decision could have spent better."""
    loop = asyncio.get_running_loop()
    stalls: list[tuple[float, float]] = []  # (from, to): the loop ran none of its callbacks

    async def watch_the_loop() -> None:
        tick = 0.005
        while True:
            due = loop.time() + tick
            await asyncio.sleep(tick)
            if loop.time() - due > 0.002:
                stalls.append((due, loop.time()))

    def stalled(start: float, end: float) -> float:
        return sum(max(0.0, min(end, to) - max(start, since)) for since, to in stalls)

    async def one() -> tuple[float, float]:
        sent = loop.time()
        await batcher.infer([1])
        return sent, loop.time()

    watcher = asyncio.ensure_future(watch_the_loop())
    started = loop.time()
    calls = []
    for index in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, started + index / rate - loop.time()))  # open loop: due times
        calls.append(asyncio.ensure_future(one()))
    spans = await asyncio.gather(*calls)
    watcher.cancel()
    return [(end - sent, stalled(sent, end)) for sent, end in spans]


class Decisions(NullBatchObserver):
    """What the adaptive batcher decided, in order: ("go" or "wait", size) and ("sent", size)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []

    def batch_planned(self, size: int, go: bool) -> None:
        self.log.append(("go" if go else "wait", size))

    def batch_dispatched(self, size: int, waited_s: float) -> None:
        self.log.append(("sent", size))

    def after_batch(self, count: int) -> list[tuple[str, int]]:
        """The decisions made once `count` batches had been sent."""
        sent = [index for index, (kind, _) in enumerate(self.log) if kind == "sent"]
        return self.log[sent[count - 1] + 1 :] if len(sent) >= count else []


async def test_adaptive_batching_makes_light_load_wait_for_nobody() -> None:
    model = CostlyModel()
    decisions = Decisions()
    batcher = Batcher(
        BatchingSpec(max_batch_size=32, batch_wait_timeout_s=0.05, latency_objective_s=0.2), decisions
    )
    batcher.start(model)
    await open_loop(batcher, rate=10, seconds=1.5)
    assert set(model.batches[3:]) == {1}  # once it has learned the cost: alone, ...
    later = decisions.after_batch(3)
    assert later and all(kind != "wait" for kind, _ in later), later  # ... and at once: no window paid
    await batcher.drain()


class SharedDeviceModel(CostlyModel):
    """CostlyModel on one device: concurrent batches take turns, as kernels on one GPU do."""

    def __init__(self) -> None:
        super().__init__()
        self.device = asyncio.Lock()

    async def __call__(self, items: list[Any]) -> list[Any]:
        async with self.device:
            return await super().__call__(items)


async def test_adaptive_batching_forms_batches_under_load_and_keeps_the_objective() -> None:
    # Two slots on one device: a batch sent while another runs only queues for the device, so
    # small ones waste it; the adaptive batcher waits for company there, within the objective.
    model = SharedDeviceModel()
    objective = ObjectiveCount()
    config = BatchingSpec(
        max_batch_size=32, max_concurrent_batches=2, batch_wait_timeout_s=0, latency_objective_s=0.15
    )
    batcher = Batcher(config, objective)
    batcher.start(model)
    timings = await open_loop(batcher, rate=150, seconds=2)  # alone, the model keeps up with ~47/s
    latencies = [latency for latency, _ in timings]
    learned = model.batches[len(model.batches) // 2 :]
    assert sum(learned) / len(learned) > 3  # it waits for company when it has to
    own = [latency - held_up for latency, held_up in timings[len(timings) // 2 :]]
    late = sum(1 for latency in own if latency > 0.15)
    assert late <= 0.05 * len(own), sorted(own)[-10:]
    # What batchd_objective_items and _missed count: every item answered, those over the objective.
    assert objective.items == len(latencies)
    assert objective.late <= sum(1 for latency in latencies if latency > 0.15)  # the client saw more
    await batcher.drain()


class ObjectiveCount(NullBatchObserver):
    def __init__(self) -> None:
        self.items = self.late = 0

    def objective_checked(self, items: int, late: int) -> None:
        self.items += items
        self.late += late


async def test_a_latency_objective_set_live_replaces_the_window_at_the_next_batch() -> None:
    model = CostlyModel()
    decisions = Decisions()
    batcher = Batcher(BatchingSpec(max_batch_size=32, batch_wait_timeout_s=0.2), decisions)
    batcher.start(model)
    windowed = sorted(latency for latency, _ in await open_loop(batcher, rate=10, seconds=1.0))
    assert windowed[len(windowed) // 2] > 0.1  # most requests paid much of the 200 ms window

    batcher.reconfigure(BatchingSpec(max_batch_size=32, batch_wait_timeout_s=0.2, latency_objective_s=0.5))
    sent_before = len(model.batches)
    await open_loop(batcher, rate=10, seconds=1.5)
    later = decisions.after_batch(sent_before + 5)
    assert later and all(kind != "wait" for kind, _ in later), later  # the model idle: no wait at all
    await batcher.drain()
