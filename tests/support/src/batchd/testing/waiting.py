"""Bounded polls: how a test waits for something another process does, never by sleeping a guess."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(probe: Callable[[], T], *, what: str, timeout_s: float = 30.0, interval_s: float = 0.1) -> T:
    """Call `probe` until it returns something truthy, and return that; after `timeout_s`, fail
    saying what was awaited and what was last seen."""
    deadline = time.monotonic() + timeout_s
    last = probe()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last seen: {last!r}")
        time.sleep(interval_s)
        last = probe()
    return last
