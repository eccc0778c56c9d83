"""The queue's order and its room: strict priority between levels, turns between the equal classes
of a level and between the callers of a class, first come within a caller; a full queue makes room
for a higher level from the newest live items of the lowest one, sheddable work is refused first,
and an item whose request stopped waiting counts for nothing at once."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from batchd.api.spec import SHEDDABLE_SHARE
from batchd.replica.queueing import PURGE_SLACK, PendingQueue, PriorityClass

CLASSES = (PriorityClass("batch", 0), PriorityClass("search", 10), PriorityClass("prefetch", -5))
EQUALS = (PriorityClass("gold", 5), PriorityClass("silver", 5), PriorityClass("bronze", 0))
_clock = itertools.count()


@dataclass(eq=False)
class Item:
    name: str
    arrived_at: float = field(default_factory=lambda: float(next(_clock)))
    future: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    caller: str = ""
    counted_in: Any = None

    def abandoned(self) -> bool:
        return self.future.done()


def queued(queue: PendingQueue[Item], *names: str, lane: str = "batch", caller: str = "") -> list[Item]:
    items = [Item(name) for name in names]
    for item in items:
        queue.push(item, lane, caller)
    return items


def leave(queue: PendingQueue[Item], *items: Item) -> None:
    """The items' requests stop waiting (their clients left), as the batcher tells the queue."""
    for item in items:
        item.future.cancel()
        queue.forget(item)


def names(items: list[Item] | list[tuple[Item, PriorityClass]]) -> list[str]:
    return [(entry[0] if isinstance(entry, tuple) else entry).name for entry in items]


async def test_one_class_and_no_callers_is_first_come_first_served() -> None:
    queue: PendingQueue[Item] = PendingQueue()
    for name in "abcde":
        queue.push(Item(name), "default")
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


async def test_classes_of_one_priority_take_turns_whatever_their_order_or_their_load() -> None:
    queue: PendingQueue[Item] = PendingQueue(EQUALS)
    queued(queue, *(f"g{n}" for n in range(6)), lane="gold")
    queued(queue, "s0", "s1", lane="silver")
    queued(queue, "b0", lane="bronze")
    assert names(queue.take_live(6)) == ["g0", "s0", "g1", "s1", "g2", "g3"]
    # Both backlogged: equal shares, whichever was declared first and whatever each sends.
    served: Counter[str] = Counter()
    for _ in range(50):
        queued(queue, "g", "g", "g", lane="gold")
        queued(queue, "s", lane="silver")
        served.update(item.name[0] for item in queue.take_live(2))
    assert served["s"] == 50 and served["g"] == 50


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


async def test_an_item_whose_request_stopped_waiting_counts_for_nothing_at_once_and_is_never_served() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    gone, kept = queued(queue, "gone", "kept")
    shed = queued(queue, "shed", lane="prefetch")
    leave(queue, gone, *shed)
    assert len(queue) == 1 and queue.sheddable_live == 0
    assert dict(queue.depths()) == {"search": 0, "batch": 1, "prefetch": 0}
    assert queue.drop_dead_first() and queue.first() is kept
    leave(queue, kept)
    assert not queue.drop_dead_first() and len(queue) == 0


async def test_dead_items_are_purged_once_they_outnumber_the_live_ones() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    live = queued(queue, "live")
    for n in range(3 * PURGE_SLACK):
        leave(queue, *queued(queue, f"dead{n}", lane="prefetch", caller=f"c{n % 3}"))
    assert len(queue) == 1
    assert sum(1 for _ in queue) == 1  # only the live one is iterated
    assert queue._held <= 2 + PURGE_SLACK + 1  # the dead were dropped as they piled up
    assert queue.take_live(10) == live


async def test_a_full_queue_makes_room_for_a_higher_class_from_the_newest_items_of_the_lowest() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    queued(queue, "b1", "b2")
    queued(queue, "p1", "p2", lane="prefetch")
    made = queue.room_for("batch", 1, max_queued=4)
    assert made is not None and names(made) == ["p2"]  # the newest of the lowest class
    assert len(queue) == 3
    made = queue.room_for("search", 3, max_queued=4)
    assert made is not None and names(made) == ["p1", "b2"]  # the lowest class first, then the next
    assert len(queue) == 1 and queue.first().name == "b1"  # type: ignore[union-attr]


async def test_room_is_made_from_live_items_only_the_dead_hold_none() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    queued(queue, "b1", "b2")
    newest = queued(queue, "b3")
    leave(queue, *newest)
    assert queue.room_for("batch", 1, max_queued=3) == []  # the dead one's place is free
    queued(queue, "b4")
    made = queue.room_for("search", 1, max_queued=3)
    assert made is not None and names(made) == ["b4"]  # the newest live item, not the dead b3


async def test_no_room_is_made_from_an_equal_or_higher_level_and_then_nothing_is_taken() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    queued(queue, "s1", lane="search")
    queued(queue, "b1")
    assert queue.room_for("batch", 1, max_queued=2) is None  # only its equal and above
    assert queue.room_for("search", 2, max_queued=2) is None  # one below, two short
    assert len(queue) == 2
    assert queue.room_for("search", 1, max_queued=3) == []  # it fits as it is
    equals: PendingQueue[Item] = PendingQueue(EQUALS)
    queued(equals, "s1", "s2", lane="silver")
    assert equals.room_for("gold", 1, max_queued=2) is None  # an equal class takes no place
    queued(equals, "b1", lane="bronze")
    made = equals.room_for("gold", 1, max_queued=3)
    assert made is not None and names(made) == ["b1"]  # a lower level does


async def test_sheddable_work_is_refused_at_half_the_queue_counted_before_it_joins() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    bound = 10
    mark = int(bound * SHEDDABLE_SHARE)
    assert queue.room_for("prefetch", mark + 2, bound) == []  # larger than half, on an idle queue
    queued(queue, *(f"b{n}" for n in range(mark - 1)))
    assert queue.room_for("prefetch", 2, bound) == []
    queued(queue, "b-last")
    assert queue.room_for("prefetch", 1, bound) is None  # at the mark: refused, though the queue has room
    assert queue.room_for("batch", 1, bound) == []  # the default class still fits


async def test_retuned_classes_keep_each_items_class_and_callers_order_else_the_default() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES)
    queued(queue, "s1", lane="search", caller="page")
    queued(queue, "p1", "p2", lane="prefetch")
    queued(queue, "b1", caller="job")
    leave(queue, *queued(queue, "gone"))
    again = queue.regrouped((PriorityClass("search", 1), PriorityClass("batch", 0)), default="batch")
    assert len(again) == 4
    assert dict(again.depths()) == {"search": 1, "batch": 3}
    assert names(again.take_live(4)) == ["s1", "b1", "p1", "p2"]


async def test_first_come_is_one_line_in_arrival_order_that_still_counts_each_class() -> None:
    queue: PendingQueue[Item] = PendingQueue(CLASSES, first_come=True)
    queued(queue, "h1", "h2", "h3", caller="heavy")
    queued(queue, "s1", lane="search", caller="light")
    queued(queue, "p1", lane="prefetch", caller="heavy")
    assert dict(queue.depths()) == {"search": 1, "batch": 3, "prefetch": 1}
    assert queue.room_for("search", 1, max_queued=5) is None  # no place taken
    assert queue.room_for("prefetch", 3, max_queued=8) == []  # nothing shed early
    assert names(queue.take_live(5)) == ["h1", "h2", "h3", "s1", "p1"]
