"""Something done at a fixed interval while a load runs: scraping `/metrics`, reading `/load`,
sampling a server process's CPU and memory.

From `delay_s` after entering until leaving, every `every_s`, and once more on leaving so that the
last interval is seen too; times are seconds since `start` (the load's own start, when given).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType
from typing import Self


class Periodic:
    """Subclasses say what one tick does (`tick`), and what to open and close around the ticks."""

    def __init__(self, every_s: float, *, delay_s: float = 0.0, start: float | None = None) -> None:
        self.every_s, self.delay_s = every_s, delay_s
        self.start = time.perf_counter() if start is None else start
        self._stop = asyncio.Event()
        self._task: asyncio.Future[None] | None = None

    async def open(self) -> None:
        """Before the first tick."""

    def close(self) -> None:
        """After the last tick, whatever happened."""

    async def tick(self, at: float) -> None:
        raise NotImplementedError

    async def _run(self) -> None:
        await self.open()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.delay_s)
            while True:
                await self.tick(time.perf_counter() - self.start)
                if self._stop.is_set():
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.every_s)
        finally:
            self.close()

    async def __aenter__(self) -> Self:
        self._task = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
