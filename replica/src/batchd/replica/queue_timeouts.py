"""Time limits in the queue by class (`priority_classes[].queue_timeout_s`, Triton's timeout per
priority level): a request of such a class still queued when its limit passes is refused (503 with
Retry-After), so that an interactive class fails fast while a batch class waits its turn.

Items of one class and one limit time out in the order they arrived, so each (class, limit) keeps
its items in one line with one timer, set for the line's oldest: an item costs one append, and
nothing is scanned. An item that left the queue meanwhile (served, displaced, dead) is passed over
when its time comes; that is the owner's `expired` callback to tell.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Generic, TypeVar

ItemT = TypeVar("ItemT")
# The loop's timers may fire this much before their time (its clock's resolution): an item due
# that soon is due now, rather than a timer set again for it.
EARLY_S = 0.001


class _Line(Generic[ItemT]):
    __slots__ = ("items", "timer")

    def __init__(self) -> None:
        self.items: collections.deque[tuple[float, ItemT]] = collections.deque()  # (when, item), in order
        self.timer: asyncio.TimerHandle | None = None


class QueueTimeouts(Generic[ItemT]):
    """Calls `expired(item, timeout_s)` on the event loop once `timeout_s` has passed since the
    item was added, for each item added."""

    def __init__(self, expired: Callable[[ItemT, float], None]) -> None:
        self._expired = expired
        self._lines: dict[tuple[str, float], _Line[ItemT]] = {}

    def add(self, item: ItemT, class_name: str, timeout_s: float, arrived_at: float) -> None:
        """Watch `item` of `class_name`, which arrived at `arrived_at` (the running loop's time)."""
        key = (class_name, timeout_s)
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = _Line()
        line.items.append((arrived_at + timeout_s, item))
        if line.timer is None:
            line.timer = asyncio.get_running_loop().call_at(arrived_at + timeout_s, self._due, key)

    def clear(self) -> None:
        """Watch nothing more (the queue has drained)."""
        for line in self._lines.values():
            if line.timer is not None:
                line.timer.cancel()
        self._lines.clear()

    def _due(self, key: tuple[str, float]) -> None:
        line = self._lines[key]
        line.timer = None
        loop = asyncio.get_running_loop()
        now = loop.time() + EARLY_S
        while line.items and line.items[0][0] <= now:
            _, item = line.items.popleft()
            self._expired(item, key[1])
        if line.items:
            line.timer = loop.call_at(line.items[0][0], self._due, key)
        else:
            del self._lines[key]
