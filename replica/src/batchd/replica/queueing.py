"""The replica's queue of waiting items: which one goes into the next batch, which one makes room,
and how many wait.

Items wait by priority level: the classes of one priority form one level, and a batch takes every
item of a higher level before any of a lower one (strict priority). Within a level the classes
take turns, one item each, and within a class each caller (its fairness id) has a line of its own
and the callers take turns (round robin): equal classes, and the callers of one class, that are
all backlogged get equal shares of the batch slots whatever each sends. Within a line, first come,
first served. One class and no fairness ids is the plain first-come queue, at the same cost.

Only live items count. An item whose request stopped waiting (its client left, its deadline
passed) is dead: `forget` uncounts it at once, so it holds no place against the bound, the
sheddable half, or the load the replica reports (and autoscales on); it is dropped unseen when it
reaches the front of its line, when a displacement meets it, or when the dead outnumber the live
(`_purge`, paid for by the pushes that made them).

A full queue makes room for items of a higher level by taking the most recently queued live items
of the lowest levels below it (`room_for`): their requests are refused (503 with Retry-After), the
ones that waited least. An equal level never takes a place. A sheddable class (negative priority)
is admitted only while the queue holds less than `SHEDDABLE_SHARE` of its bound (counted before
the request joins it), so sheddable work is refused first as the queue fills, and it never takes
another item's place. `first_come` serves every class and caller in arrival order, takes no place
and sheds nothing early, and still counts each class apart.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

from batchd.api.priority import NO_CLASSES, PriorityClass
from batchd.api.spec import ANONYMOUS_TENANT, SHEDDABLE_SHARE

__all__ = ["NO_CALLER", "PendingQueue", "PriorityClass", "Queued"]

NO_CALLER = ""


def fair_line(tenant: str, caller: str) -> str:
    """The line `caller` of `tenant` waits in within its class: its own within its tenant, so two
    tenants never share a line whatever ids their callers send. An open deployment's callers are
    all `anonymous`, their lines their ids. (A stamped caller is printable: it holds no NUL.)"""
    return caller if tenant == ANONYMOUS_TENANT else f"{tenant}\0{caller}"


def tenant_of(line: str) -> str:
    """The tenant whose caller waits in `line` (`fair_line`)."""
    tenant, separator, _ = line.partition("\0")
    return tenant if separator else ANONYMOUS_TENANT


def caller_in(line: str) -> str:
    """The caller within its tenant that waits in `line`, as it named itself (`fair_line`)."""
    return line.rpartition("\0")[2]


# A purge runs once the dead items held exceed the live ones by this many (and by their number).
PURGE_SLACK = 64


class Queued(Protocol):
    """An item the queue holds: when it arrived, who sent it, and where it is counted (set by the
    queue: its class's tally while it waits alive, else None)."""

    arrived_at: float
    caller: str
    counted_in: Any

    def abandoned(self) -> bool:
        """Whether its request stopped waiting (answered, left, late): it is dropped, not served."""
        ...


QueuedT = TypeVar("QueuedT", bound=Queued)


class _Tally:
    """One class's live items (its depth); what a queued item is counted in."""

    __slots__ = ("live", "priority_class")

    def __init__(self, priority_class: PriorityClass) -> None:
        self.priority_class = priority_class
        self.live = 0


class _Lane(Generic[QueuedT]):
    """The items of one class (first come: of every class), a line per caller, in turn order: the
    first line's head goes next, and a line that gave an item moves to the back."""

    __slots__ = ("held", "lines")

    def __init__(self) -> None:
        self.lines: dict[str, collections.deque[QueuedT]] = {}
        self.held = 0  # items in its lines, dead or alive

    def push(self, pending: QueuedT, caller: str) -> None:
        line = self.lines.get(caller)
        if line is None:
            line = self.lines[caller] = collections.deque()
        line.append(pending)
        self.held += 1

    def first(self) -> QueuedT:
        return next(iter(self.lines.values()))[0]

    def pop(self) -> QueuedT:
        caller, line = next(iter(self.lines.items()))
        pending = line.popleft()
        self.held -= 1
        if not line:
            del self.lines[caller]
        elif len(self.lines) > 1:
            self.lines[caller] = self.lines.pop(caller)  # its turn is over
        return pending


class _Level(Generic[QueuedT]):
    """The classes of one priority, taking turns: the first lane with items goes next, and a lane
    that gave an item moves to the back."""

    __slots__ = ("held", "lanes", "priority", "tallies", "turns")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.lanes: dict[str, _Lane[QueuedT]] = {}  # by class name (first come: one, "")
        self.tallies: list[_Tally] = []  # its classes' counts
        self.turns: dict[str, _Lane[QueuedT]] = {}  # the lanes that hold items, in turn order
        self.held = 0

    @property
    def live(self) -> int:
        return sum(tally.live for tally in self.tallies)

    def push(self, pending: QueuedT, lane: str, caller: str) -> None:
        found = self.lanes[lane]
        found.push(pending, caller)
        if lane not in self.turns:
            self.turns[lane] = found
        self.held += 1

    def first(self) -> QueuedT:
        return next(iter(self.turns.values())).first()

    def pop(self) -> QueuedT:
        name, lane = next(iter(self.turns.items()))
        pending = lane.pop()
        self.held -= 1
        if not lane.held:
            del self.turns[name]
        elif len(self.turns) > 1:
            self.turns[name] = self.turns.pop(name)  # its turn is over
        return pending

    def pop_newest(self) -> QueuedT:
        """The most recently queued item, over every line of every class, dead or alive."""
        lane, caller, line = max(
            ((lane, caller, line) for lane in self.turns.values() for caller, line in lane.lines.items()),
            key=lambda entry: entry[2][-1].arrived_at,
        )
        pending = line.pop()
        lane.held -= 1
        self.held -= 1
        if not line:
            del lane.lines[caller]
        if not lane.held:
            self.turns = {name: found for name, found in self.turns.items() if found is not lane}
        return pending


class PendingQueue(Generic[QueuedT]):
    """The waiting items of one replica, in levels by priority, lanes by class, lines by caller."""

    def __init__(
        self, classes: Sequence[PriorityClass] = NO_CLASSES.classes, first_come: bool = False
    ) -> None:
        """`classes` (kept highest priority first, equals in their order); `first_come`: one line
        for every class and caller, in arrival order, where no item takes another's place and none
        is shed early (the order before priority classes, to compare with)."""
        self.classes = tuple(sorted(classes, key=lambda priority_class: -priority_class.priority))
        self.first_come = first_come
        self._tallies = {c.name: _Tally(c) for c in self.classes}
        self._by_tenant: collections.Counter[str] = collections.Counter()  # live items per tenant
        self._sheddable = [self._tallies[c.name] for c in self.classes if c.sheddable]
        self.sheddable = frozenset(c.name for c in self.classes if c.sheddable)  # class names
        self._levels: list[_Level[QueuedT]] = []
        self._level_of: dict[str, _Level[QueuedT]] = {}
        for priority_class in self.classes:
            priority = 0 if first_come else priority_class.priority
            if not self._levels or self._levels[-1].priority != priority:
                self._levels.append(_Level(priority))
            level = self._levels[-1]
            lane = "" if first_come else priority_class.name
            level.lanes.setdefault(lane, _Lane())
            level.tallies.append(self._tallies[priority_class.name])
            self._level_of[priority_class.name] = level
        self._live = 0
        self._held = 0  # items in the lines, dead or alive

    # -- what it holds ---------------------------------------------------------------------

    def __len__(self) -> int:
        """The live items: what counts against the bound, and as the replica's queued load."""
        return self._live

    def __iter__(self) -> Iterator[QueuedT]:
        """Every live item, in no particular order."""
        for level in self._levels:
            for lane in level.lanes.values():
                for line in lane.lines.values():
                    yield from (pending for pending in line if pending.counted_in is not None)

    @property
    def sheddable_live(self) -> int:
        """The live items of sheddable classes."""
        return sum(tally.live for tally in self._sheddable)

    def depths(self) -> list[tuple[str, int]]:
        """Live items waiting, by class."""
        return [(name, tally.live) for name, tally in self._tallies.items()]

    def oldest_arrival(self) -> float:
        """When the longest-waiting item arrived (each line's head is its oldest); inf when empty."""
        return min(
            (
                line[0].arrived_at
                for level in self._levels
                for lane in level.turns.values()
                for line in lane.lines.values()
            ),
            default=math.inf,
        )

    # -- in and out ------------------------------------------------------------------------

    def push(self, pending: QueuedT, class_name: str, caller: str = NO_CALLER) -> None:
        """Queue `pending` in `class_name` (one of `classes`) as `caller`, live."""
        tally = self._tallies[class_name]
        pending.caller = caller
        pending.counted_in = tally
        tally.live += 1
        self._live += 1
        self._by_tenant[tenant_of(caller)] += 1
        if self.first_come:
            self._level_of[class_name].push(pending, "", NO_CALLER)  # one line, whoever sends
        else:
            self._level_of[class_name].push(pending, class_name, caller)
        self._held += 1
        if self._held - self._live > self._live + PURGE_SLACK:
            self._purge()

    def forget(self, pending: QueuedT) -> None:
        """`pending` no longer counts (its request stopped waiting, or it left the queue); it stays
        in its line until it is dropped there. Nothing when it counts already not."""
        tally = pending.counted_in
        if tally is not None:
            pending.counted_in = None
            tally.live -= 1
            self._live -= 1
            self._by_tenant[tenant_of(pending.caller)] -= 1

    def waiting_of(self, tenant: str) -> int:
        """The live items of `tenant`'s callers (`fair_line`), whatever their class."""
        return self._by_tenant[tenant]

    def first(self) -> QueuedT | None:
        """The item that goes next, dead or alive."""
        for level in self._levels:
            if level.held:
                return level.first()
        return None

    def drop_dead_first(self) -> bool:
        """Drop dead items from the front; True when a live item goes next."""
        for level in self._levels:
            while level.held:
                if self._alive(level.first()):
                    return True
                self.forget(level.pop())
                self._held -= 1
        return False

    def take_live(self, limit: int) -> list[QueuedT]:
        """Up to `limit` live items, in the order they go, out of the queue; dead ones met on the
        way are dropped."""
        batch: list[QueuedT] = []
        for level in self._levels:
            while level.held and len(batch) < limit:
                pending = level.pop()
                self._held -= 1
                if self._alive(pending):
                    batch.append(pending)
                self.forget(pending)
        return batch

    def room_for(
        self, class_name: str, count: int, max_queued: int, free: int = 0
    ) -> list[tuple[QueuedT, PriorityClass]] | None:
        """Whether `count` items of `class_name` may be queued now: the live items that make room
        for them, taken out of the queue, each with its class (none when they fit as they are),
        or None when they are refused (then nothing was taken). `free`: places that take items at
        once (token-level generation's free rows); the items bound for them wait behind no one,
        and count neither against the bound nor the sheddable mark."""
        waiting = max(0, self._live - free)
        if not self.first_come and self._tallies[class_name].priority_class.sheddable:
            fits = (
                waiting < math.floor(max_queued * SHEDDABLE_SHARE) and self._live + count <= max_queued + free
            )
            return [] if fits else None
        short = self._live + count - max_queued - free
        if short <= 0:
            return []
        if self.first_come:
            return None
        own = self._level_of[class_name]
        below = self._levels[self._levels.index(own) + 1 :]
        if sum(level.live for level in below) < short:
            return None
        made: list[tuple[QueuedT, PriorityClass]] = []
        for level in reversed(below):  # the lowest level first
            while level.live and len(made) < short:
                pending = level.pop_newest()
                self._held -= 1
                tally = pending.counted_in
                if tally is not None and self._alive(pending):
                    self.forget(pending)
                    made.append((pending, tally.priority_class))
                else:
                    self.forget(pending)
        return made

    def regrouped(
        self, classes: Sequence[PriorityClass], default: str, first_come: bool = False
    ) -> PendingQueue[QueuedT]:
        """This queue's live items under new classes (live retuning): an item keeps its class and
        caller where its class remains, else it joins `default`; each line keeps its order."""
        queue: PendingQueue[QueuedT] = PendingQueue(classes, first_come)
        for level in self._levels:
            for lane in level.lanes.values():
                for line in lane.lines.values():
                    for pending in line:
                        tally = pending.counted_in
                        if tally is None or pending.abandoned():
                            continue
                        name = tally.priority_class.name
                        queue.push(pending, name if name in queue._tallies else default, pending.caller)
        return queue

    # -- dead items ------------------------------------------------------------------------

    @staticmethod
    def _alive(pending: QueuedT) -> bool:
        return pending.counted_in is not None and not pending.abandoned()

    def _purge(self) -> None:
        """Drop every dead item from the lines (the live ones keep their order and turns)."""
        for level in self._levels:
            for name, lane in list(level.turns.items()):
                for caller, line in list(lane.lines.items()):
                    kept = [pending for pending in line if self._alive(pending)]
                    for pending in line:
                        if not self._alive(pending):
                            self.forget(pending)
                    lane.held -= len(line) - len(kept)
                    level.held -= len(line) - len(kept)
                    self._held -= len(line) - len(kept)
                    if kept:
                        lane.lines[caller] = collections.deque(kept)
                    else:
                        del lane.lines[caller]
                if not lane.held:
                    del level.turns[name]
