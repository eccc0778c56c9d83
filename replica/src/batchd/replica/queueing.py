"""The replica's queue of waiting items: which one goes into the next batch, and which one makes room.

Items wait in lanes, one per priority class, the highest first: a batch takes every item of a
higher lane before any of a lower one (strict priority). Within a lane each caller (its fairness
id) has a line of its own, and the lane takes from its lines in turn, one item each (round robin):
callers that are all backlogged get equal shares of the batch slots whatever each sends, so a
heavy caller cannot starve a light one. Within a line, first come, first served. One lane and no
fairness ids is the plain first-come queue, at the same cost.

A full queue makes room for the items of a higher lane by taking the most recently queued items
of the lowest lanes below it (`room_for`): their requests are refused (503 with Retry-After), the
ones that have waited least. A lane of negative priority is sheddable: it admits only while the
queue is under `SHEDDABLE_SHARE` of its bound, so sheddable work is refused first as the queue
fills, and it never makes room by taking another item's place.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from batchd.api.spec import SHEDDABLE_SHARE

NO_CALLER = ""


@dataclass(frozen=True)
class PriorityClass:
    name: str
    priority: int  # higher goes first; negative: sheddable

    @property
    def sheddable(self) -> bool:
        return self.priority < 0


FIRST_COME = (PriorityClass("default", 0),)
ALL_CLASSES = PriorityClass("all", 0)  # the one lane of a first-come queue


class Queued(Protocol):
    arrived_at: float

    def abandoned(self) -> bool:
        """Whether its request stopped waiting (answered, left, late): it is dropped, not served."""
        ...


QueuedT = TypeVar("QueuedT", bound=Queued)


class _Lane(Generic[QueuedT]):
    __slots__ = ("lines", "priority_class", "size")

    def __init__(self, priority_class: PriorityClass) -> None:
        self.priority_class = priority_class
        # Each caller's line, in turn order: the first line's head goes next, and a line that
        # gave an item moves to the back.
        self.lines: dict[str, collections.deque[QueuedT]] = {}
        self.size = 0

    def first(self) -> QueuedT:
        return next(iter(self.lines.values()))[0]

    def pop(self) -> QueuedT:
        caller, line = next(iter(self.lines.items()))
        pending = line.popleft()
        self.size -= 1
        if not line:
            del self.lines[caller]
        elif len(self.lines) > 1:
            self.lines[caller] = self.lines.pop(caller)  # its turn is over
        return pending

    def pop_newest(self) -> QueuedT:
        """The most recently queued item, over every line."""
        caller, line = max(self.lines.items(), key=lambda entry: entry[1][-1].arrived_at)
        pending = line.pop()
        self.size -= 1
        if not line:
            del self.lines[caller]
        return pending


class PendingQueue(Generic[QueuedT]):
    """The waiting items of one replica, in lanes by priority class and lines by caller."""

    def __init__(self, classes: Sequence[PriorityClass] = FIRST_COME, first_come: bool = False) -> None:
        """`first_come`: one lane for every class, in arrival order; no item takes another's place
        and none is shed early (the order before priority classes, to compare with)."""
        ordered = sorted(classes, key=lambda priority_class: -priority_class.priority)
        self.classes = tuple(ordered)  # highest priority first
        self.sheddable = frozenset(c.name for c in ordered if c.sheddable)  # class names
        self.first_come = first_come
        lanes = [ALL_CLASSES] if first_come else ordered
        self._lanes: list[_Lane[QueuedT]] = [_Lane(priority_class) for priority_class in lanes]
        self._lane_of = {c.name: 0 if first_come else index for index, c in enumerate(ordered)}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[QueuedT]:
        """Every queued item, in no particular order."""
        for lane in self._lanes:
            for line in lane.lines.values():
                yield from line

    def lane_class(self, lane: int) -> PriorityClass:
        return self._lanes[lane].priority_class

    def lane(self, class_name: str) -> int:
        """The lane of a priority class; KeyError when there is none of that name."""
        return self._lane_of[class_name]

    def depths(self) -> list[tuple[str, int]]:
        """Items waiting, by class (first come: every class together, as `all`)."""
        return [(lane.priority_class.name, lane.size) for lane in self._lanes]

    def push(self, pending: QueuedT, lane: int = 0, caller: str = NO_CALLER) -> None:
        if self.first_come:
            caller = NO_CALLER  # one line, in arrival order, whoever sends
        line = self._lanes[lane].lines.get(caller)
        if line is None:
            line = self._lanes[lane].lines[caller] = collections.deque()
        line.append(pending)
        self._lanes[lane].size += 1
        self._size += 1

    def first(self) -> QueuedT | None:
        """The item that goes next, dead or alive."""
        for lane in self._lanes:
            if lane.size:
                return lane.first()
        return None

    def drop_dead_first(self) -> bool:
        """Drop abandoned items from the front; True when a live item goes next."""
        for lane in self._lanes:
            while lane.size:
                if not lane.first().abandoned():
                    return True
                lane.pop()
                self._size -= 1
        return False

    def take_live(self, limit: int) -> list[QueuedT]:
        """Up to `limit` live items, in the order they go; dead ones met on the way are dropped."""
        batch: list[QueuedT] = []
        for lane in self._lanes:
            while lane.size and len(batch) < limit:
                pending = lane.pop()
                self._size -= 1
                if not pending.abandoned():
                    batch.append(pending)
        return batch

    def oldest_arrival(self) -> float:
        """When the longest-waiting item arrived (each line's head is its oldest); inf when empty."""
        return min(
            (line[0].arrived_at for lane in self._lanes for line in lane.lines.values()), default=math.inf
        )

    def room_for(self, lane: int, count: int, max_queued: int) -> list[tuple[QueuedT, PriorityClass]] | None:
        """Whether `count` items of `lane` may be queued now: the items that make room for them,
        taken out of the queue, each with its class (none when they fit as they are), or None when
        they are refused (then nothing was taken)."""
        priority_class = self._lanes[lane].priority_class
        if priority_class.sheddable:
            bound = math.floor(max_queued * SHEDDABLE_SHARE)
            return [] if self._size + count <= bound else None
        short = self._size + count - max_queued
        if short <= 0:
            return []
        below = self._lanes[lane + 1 :]
        if sum(lower.size for lower in below) < short:
            return None
        made: list[tuple[QueuedT, PriorityClass]] = []
        for lower in reversed(below):  # the lowest lane first
            while lower.size and len(made) < short:
                made.append((lower.pop_newest(), lower.priority_class))
                self._size -= 1
        return made

    def regrouped(
        self, classes: Sequence[PriorityClass], default: str, first_come: bool = False
    ) -> PendingQueue[QueuedT]:
        """This queue's items under new classes (live retuning): an item keeps its class and caller
        where its class remains, else it joins `default`; each line keeps its order."""
        queue: PendingQueue[QueuedT] = PendingQueue(classes, first_come)
        for lane in self._lanes:
            target = queue._lane_of.get(lane.priority_class.name, queue._lane_of[default])
            for caller, line in lane.lines.items():
                for pending in line:
                    queue.push(pending, target, caller)
        return queue
