"""The queue's order and its room: strict priority between classes, turns between callers within a
class, first come within a caller; a full queue makes room for a higher class from the newest
items of the lowest one, and sheddable work is refused first."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass, field

import pytest

from batchd.api.spec import SHEDDABLE_SHARE
from batchd.replica.queueing import PendingQueue, PriorityClass

CLASSES = (PriorityClass("batch", 0), PriorityClass("search", 10), PriorityClass("prefetch", -5))
_clock = itertools.count()


@dataclass(eq=False)
class Item:
    name: str
    arrived_at: float = field(default_factory=lambda: float(next(_clock)))
    future: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def leave(self) -> None:
        self.future.cancel()

    def abandoned(self) -> bool:
        return self.future.done()


def queued(queue: PendingQueue[Item], *names: str, lane: str = "batch", caller: str = "") -> list[Item]:
    items = [Item(name) for name in names]
    for item in items:
        queue.push(item, queue.lane(lane), caller)
    return items


def names(items: list[Item] | list[tuple[Item, PriorityClass]]) -> list[str]:
    return [(entry[0] if isinstance(entry, tuple) else entry).name for entry in items]


async def test_one_class_and_no_callers_is_first_come_first_served() -> None:
    queue: PendingQueue[Item] = PendingQueue()
    for name in "abcde":
        queue.push(Item(name))
    first = queue.first()
    assert len(queue) == 5 and first is not None and first.name == "a"
    assert names(queue.take_live(3)) == ["a", "b", "c"]
    assert names(queue.take_live(10)) == ["d", "e"] and len(queue) == 0


async def test_a_higher_class_goes_first_whenever_it_arrived() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    queued(queue, "low1", "low2", lane="prefetch")
    queued(queue, "b1", "b2")
    queued(queue, "s1", lane="search")
    assert [c.name for c in queue.classes] == ["search", "batch", "prefetch"]
    assert names(queue.take_live(4)) == ["s1", "b1", "b2", "low1"]
    # The window still counts from the longest wait: the sheddable item queued first.
    queued(queue, "s2", lane="search")
    assert queue.oldest_arrival() < queue.first().arrived_at  # type: ignore[union-attr]


async def test_callers_in_one_class_take_turns_so_a_heavy_one_cannot_starve_a_light_one() -> None:
    queue: PendingQueue[Item] = PendingQueue()
    queued(queue, *(f"heavy{n}" for n in range(10)), lane="default", caller="indexer")
    queued(queue, "light0", "light1", lane="default", caller="search-page")
    assert names(queue.take_live(5)) == ["heavy0", "light0", "heavy1", "light1", "heavy2"]
    # Both backlogged: equal shares of the batch slots, whatever each sends.
    queue = PendingQueue()
    served: Counter[str] = Counter()
    for _ in range(50):
        queued(queue, *(f"h{n}" for n in range(10)), lane="default", caller="heavy")
        queued(queue, "l", lane="default", caller="light")
        served.update(item.name[0] for item in queue.take_live(2))
    assert served["l"] == served["h"] == 50


async def test_items_whose_requests_stopped_waiting_are_dropped_not_served() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    gone, kept = queued(queue, "gone", "kept")
    gone.leave()
    assert queue.drop_dead_first() and queue.first() is kept and len(queue) == 1
    kept.leave()
    assert not queue.drop_dead_first() and len(queue) == 0


async def test_a_full_queue_makes_room_for_a_higher_class_from_the_newest_items_of_the_lowest() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    queued(queue, "b1", "b2")
    queued(queue, "p1", "p2", lane="prefetch")
    made = queue.room_for(queue.lane("batch"), 1, max_queued=4)
    assert made is not None and names(made) == ["p2"]  # the newest of the lowest class
    assert len(queue) == 3
    made = queue.room_for(queue.lane("search"), 3, max_queued=4)
    assert made is not None and names(made) == ["p1", "b2"]  # the lowest class first, then the next
    assert len(queue) == 1 and queue.first().name == "b1"  # type: ignore[union-attr]


async def test_no_room_is_made_from_an_equal_or_higher_class_and_then_nothing_is_taken() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    queued(queue, "s1", lane="search")
    queued(queue, "b1")
    assert queue.room_for(queue.lane("batch"), 1, max_queued=2) is None  # only its equal and above
    assert queue.room_for(queue.lane("search"), 2, max_queued=2) is None  # one below, two short
    assert len(queue) == 2
    assert queue.room_for(queue.lane("search"), 1, max_queued=3) == []  # it fits as it is


async def test_sheddable_work_is_refused_at_a_lower_mark_and_never_takes_a_place() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    shed, bound = queue.lane("prefetch"), 10
    mark = int(bound * SHEDDABLE_SHARE)
    queued(queue, *(f"b{n}" for n in range(mark - 1)))
    assert queue.room_for(shed, 1, bound) == []
    queued(queue, "b-last")
    assert queue.room_for(shed, 1, bound) is None  # at the mark: refused, though the queue has room
    assert queue.room_for(queue.lane("batch"), 1, bound) == []  # the default class still fits


async def test_retuned_classes_keep_each_items_class_and_callers_order_else_the_default() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    queued(queue, "s1", lane="search", caller="page")
    queued(queue, "p1", "p2", lane="prefetch")
    queued(queue, "b1", caller="job")
    again = queue.regrouped((PriorityClass("search", 1), PriorityClass("batch", 0)), default="batch")
    assert len(again) == 4
    assert names(again.take_live(4)) == ["s1", "b1", "p1", "p2"]


async def test_an_unknown_class_has_no_lane() -> None:
    with pytest.raises(KeyError):
        PendingQueue(CLASSES).lane("urgent")


async def test_first_come_is_one_line_in_arrival_order_whatever_the_class_or_caller() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES, first_come=True)
    queued(queue, "h1", "h2", "h3", caller="heavy")
    queued(queue, "s1", lane="search", caller="light")
    queued(queue, "h4", caller="heavy")
    assert names(queue.take_live(5)) == ["h1", "h2", "h3", "s1", "h4"]
