"""Custom batch handlers (`model.handler`) for tests, named by import path in manifests
(`batchd.testing.batch_handlers:...`)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any


def add_one(numbers: list[int]) -> list[int]:
    """A plain sync function handler."""
    return [n + 1 for n in numbers]


class SlowAdder:
    """Adds one, after holding every batch for `delay_s`: long enough to fill a queue or pass a deadline."""

    def __init__(self, delay_s: float = 0.2) -> None:
        self.delay_s = delay_s

    def __call__(self, numbers: list[int]) -> list[int]:
        time.sleep(self.delay_s)
        return [n + 1 for n in numbers]


class Failing:
    """Fails any batch that holds a negative number; the others succeed."""

    async def handle(self, numbers: list[int]) -> list[int]:
        if any(n < 0 for n in numbers):
            raise ValueError(f"negative input in batch {numbers}")
        return [n * 2 for n in numbers]


class WrongLength:
    def __call__(self, items: list[int]) -> list[int]:
        return items[:-1] or [0, 0]


class NotAList:
    def __call__(self, items: list[int]) -> dict[str, int]:
        return {"n": len(items)}


def not_json(items: list[int]) -> list[object]:
    """One result per item, but none that JSON can carry."""
    return [object() for _ in items]


class WithWarmup:
    def __init__(self) -> None:
        self.warmed = False

    def warmup(self) -> None:
        self.warmed = True

    def __call__(self, items: list[float]) -> list[float]:
        return [item * 2 for item in items]


def untyped_double(items):  # type: ignore[no-untyped-def]  # no annotation on purpose: the spec declares
    """Doubles each item, with no type annotation: only `model.inputs` can say what it takes."""
    return [item * 2 for item in items]


def untyped_add_one(items):  # type: ignore[no-untyped-def]  # untyped on purpose: any item reaches it
    """Adds one to each item, with no type annotation: an item that is no number fails it alone."""
    return [item + 1 for item in items]


def untyped_row_sums(items):  # type: ignore[no-untyped-def]
    """The sum of each row, for a declared input of shape [-1, N]."""
    return [sum(row) for row in items]


class HangsOnZero:
    """Answers at once, except for a batch holding 0: that one never comes back (a stuck GPU call)."""

    def __call__(self, numbers: list[int]) -> list[int]:
        if 0 in numbers:
            threading.Event().wait()  # forever: nothing will ever set it
        return [n + 1 for n in numbers]


class Relay:
    """A composer (`model.calls`): each item `{"to": alias, "n": number}` is sent on to that callee
    (`remote`), or `{"to": alias, "many": [numbers]}` as one call (`remote_many`); all of a batch's
    calls at once. The answer is the callee's; its errors pass through unhandled."""

    def __init__(self, **handles: Any) -> None:
        self.handles = handles

    async def __call__(self, items: list[dict[str, Any]]) -> list[Any]:
        return list(await asyncio.gather(*(self._one(item) for item in items)))

    async def _one(self, item: dict[str, Any]) -> Any:
        handle = self.handles[item["to"]]
        if "many" in item:
            return await handle.remote_many(item["many"])
        return await handle.remote(item["n"])


class SyncRelay:
    """Takes handles but is not `async def`, so it could never await them: refused at load."""

    def __init__(self, **handles: Any) -> None:
        self.handles = handles

    def __call__(self, numbers: list[int]) -> list[int]:
        return numbers


class Revision:
    """Adds one, as one revision of a model would, with faults to inject: `fail_percent` of the
    items fail, spread evenly over the items as they come (serve it with max_batch_size 1, so that
    an item is a batch), and every batch takes `delay_s`. `version` only tells revisions apart."""

    def __init__(self, version: int = 1, fail_percent: int = 0, delay_s: float = 0.0) -> None:
        self.version = version
        self.fail_percent = fail_percent
        self.delay_s = delay_s
        self.seen = 0

    def __call__(self, numbers: list[int]) -> list[int]:
        time.sleep(self.delay_s)
        before, self.seen = self.seen, self.seen + len(numbers)
        # Items seen so far that should have failed, before and after this batch: a step fails it.
        if self.seen * self.fail_percent // 100 > before * self.fail_percent // 100:
            raise RuntimeError(f"revision {self.version} fails {self.fail_percent}% of its items")
        return [n + 1 for n in numbers]


class TextLength:
    """The length of each text: a handler that takes what a text-classification pipeline takes, so
    that a deployment can switch between the two under the same requests. `version` only tells
    revisions apart."""

    def __init__(self, version: int = 1) -> None:
        self.version = version

    def __call__(self, texts: list[str]) -> list[int]:
        return [len(text) for text in texts]
