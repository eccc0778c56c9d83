"""Running model code off the server's event loop, whatever shape that code has.

Sync callables run in a thread pool of up to MAX_CONCURRENT_BATCHES threads, started only as
batches need them (the batcher bounds how many run at once, and live retuning may raise it).
`async def` callables (Ray Serve's handlers are all `async def`, and the tutorial's block
inside) run on an event loop of their own, in a thread of its own: a handler that blocks stalls
only that loop, never the one accepting requests.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from batchd.api.spec import MAX_CONCURRENT_BATCHES

T = TypeVar("T")


class ModelExecutor:
    def __init__(self, name: str = "batchd-model") -> None:
        self._pool = ThreadPoolExecutor(max_workers=MAX_CONCURRENT_BATCHES, thread_name_prefix=name)
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def run_sync(self, function: Callable[..., T], *args: Any) -> T:
        # In the caller's context, as `run_async`'s coroutine is: the batch's deadline and span.
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._pool, context.run, function, *args)

    async def run_async(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._model_loop())
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)
        with self._lock:
            if self._loop is not None and self._loop_thread is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop_thread.join(timeout=30)
                self._loop.close()
                self._loop = None

    def _model_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=f"{self._name}-loop", daemon=True)
                thread.start()
                self._loop, self._loop_thread = loop, thread
            return self._loop
