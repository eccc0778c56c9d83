"""`allow_small_batch: false`: only full batches reach the model, unless a deadline or a drain forces one.

The batcher on its own with a recording model, as in test_batching.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from batchd.api.spec import BatchingSpec
from batchd.replica.batching import SMALL_BATCH_RESERVE, Batcher
from batchd.replica.errors import DeadlineExceeded


class Model:
    """Adds one to each item; records every batch with the loop time it started; takes `delay_s`."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.batches: list[list[Any]] = []
        self.started_at: list[float] = []
        self.took_s: list[float] = []

    async def __call__(self, items: list[Any]) -> Sequence[Any]:
        loop = asyncio.get_running_loop()
        self.batches.append(list(items))
        self.started_at.append(loop.time())
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # the model's own compute time
        self.took_s.append(loop.time() - self.started_at[-1])
        return [item + 1 for item in items]


def full_batches_only(model: Model, **config: Any) -> Batcher:
    batcher = Batcher(BatchingSpec(allow_small_batch=False, **config))
    batcher.start(model)
    return batcher


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


async def windows_pass(count: int, window_s: float) -> None:
    """Returns once `count` wait windows of `window_s` have closed, one after another, as a batcher
    with the default `allow_small_batch` sees them: each lone item leaves when its window closes."""
    control = Batcher(BatchingSpec(max_batch_size=4, batch_wait_timeout_s=window_s))
    control.start(Model())
    for n in range(count):
        await asyncio.wait_for(control.infer([n]), timeout=5)
    await control.drain()


async def test_a_partial_batch_outlives_its_window_and_leaves_once_full() -> None:
    model = Model()
    batcher = full_batches_only(model, max_batch_size=4, batch_wait_timeout_s=0.01, request_timeout_s=30)
    first = [asyncio.ensure_future(batcher.infer([n])) for n in range(3)]
    await until(lambda: batcher.queue_depth == 3)
    # Twenty windows: with allow_small_batch (the default) three items would have gone.
    await windows_pass(20, 0.01)
    assert model.batches == [] and batcher.queue_depth == 3
    fourth = batcher.infer([3])
    assert await asyncio.wait_for(asyncio.gather(*first, fourth), timeout=5) == [[1], [2], [3], [4]]
    assert model.batches == [[0, 1, 2, 3]]
    await batcher.drain()


async def test_full_batches_go_at_once_and_the_remainder_waits() -> None:
    model = Model()
    batcher = full_batches_only(model, max_batch_size=4, request_timeout_s=30)
    answered = asyncio.gather(*(batcher.infer([n]) for n in range(10)))
    await until(lambda: len(model.batches) == 2)
    assert [len(batch) for batch in model.batches] == [4, 4] and batcher.queue_depth == 2
    await batcher.drain()  # the drain sends the last two as a batch of their own
    assert [len(batch) for batch in model.batches] == [4, 4, 2]
    assert await answered == [[n + 1] for n in range(10)]


async def test_a_near_deadline_sends_a_small_batch_in_time_to_be_answered() -> None:
    model = Model()
    timeout_s = 1.0
    batcher = full_batches_only(model, max_batch_size=8, request_timeout_s=timeout_s)
    loop = asyncio.get_running_loop()
    admitted = loop.time()
    assert await batcher.infer([41]) == [42]  # no 504: it left before its deadline
    left_after = model.started_at[0] - admitted
    # It waited for company as long as was safe: until a tenth of request_timeout_s was left.
    assert timeout_s * (1 - SMALL_BATCH_RESERVE) - 0.05 <= left_after < timeout_s
    assert model.batches == [[41]]
    await batcher.drain()


async def test_the_reserve_grows_with_how_long_batches_take() -> None:
    model = Model(delay_s=0.25)
    timeout_s = 2.0
    batcher = full_batches_only(model, max_batch_size=2, request_timeout_s=timeout_s)
    await asyncio.gather(batcher.infer([0]), batcher.infer([1]))  # one full batch: 0.25 s, learned
    loop = asyncio.get_running_loop()
    admitted = loop.time()
    assert await batcher.infer([5]) == [6]
    answered_after = loop.time() - admitted
    # Twice the batch time (0.5 s, more on a busy machine) is more than a tenth of the timeout
    # (0.2 s): it leaves that much before the deadline.
    reserve = 2 * model.took_s[0]
    left_after = model.started_at[-1] - admitted
    assert timeout_s - reserve - 0.15 <= left_after <= timeout_s - reserve + 0.15
    assert answered_after < timeout_s
    await batcher.drain()


async def test_a_deadline_that_passes_in_the_queue_still_gets_504() -> None:
    # A model slower than the whole timeout cannot save anyone: the reserve is no promise.
    model = Model(delay_s=0.5)
    batcher = full_batches_only(model, max_batch_size=1, request_timeout_s=0.3)
    busy = asyncio.ensure_future(batcher.infer([0]))
    await until(lambda: len(model.batches) == 1)
    with pytest.raises(DeadlineExceeded):
        await batcher.infer([1])
    with pytest.raises(DeadlineExceeded):
        await busy
    await batcher.drain()


async def test_items_whose_clients_left_do_not_count_towards_a_full_batch() -> None:
    model = Model()
    batcher = full_batches_only(model, max_batch_size=3, request_timeout_s=30)
    first = asyncio.ensure_future(batcher.infer([1]))
    leaving = asyncio.ensure_future(batcher.infer([99]))
    await until(lambda: batcher.queue_depth == 2)
    leaving.cancel()
    await until(lambda: batcher.queue_depth == 1)  # the one that left counts no more, at once
    second = asyncio.ensure_future(batcher.infer([2]))
    await until(lambda: batcher.queue_depth == 2)
    await windows_pass(5, 0.01)  # three in the queue, one of them gone: not a full batch
    assert model.batches == []
    third = batcher.infer([3])
    assert list(await asyncio.wait_for(asyncio.gather(first, second, third), timeout=5)) == [[2], [3], [4]]
    assert model.batches == [[1, 2, 3]]
    await batcher.drain()


async def test_retuning_to_allow_small_batches_releases_a_waiting_partial_batch() -> None:
    model = Model()
    batcher = full_batches_only(model, max_batch_size=4, batch_wait_timeout_s=0.01, request_timeout_s=30)
    waiting = asyncio.ensure_future(batcher.infer([7]))
    await until(lambda: batcher.queue_depth == 1)
    batcher.reconfigure(BatchingSpec(max_batch_size=4, batch_wait_timeout_s=0.01, request_timeout_s=30))
    assert await asyncio.wait_for(waiting, timeout=2) == [8]
    assert model.batches == [[7]]
    await batcher.drain()
