"""A request's wait for its results: its one deadline, and its client, watched.

A request waits until the sooner of `request_timeout_s` after its admission and the time its
client still waits (the router's `batchd-timeout-s`, the time left of its own deadline); a
request whose deadline passes or whose client goes away stops waiting (DeadlineExceeded,
ClientDisconnected), and the batcher drops its items before they reach the model. The batcher
and the generation service both wait this way.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from batchd.api.headers import TIMEOUT_HEADER
from batchd.api.spec import ANONYMOUS_TENANT
from batchd.replica.errors import ClientDisconnected, DeadlineExceeded
from batchd.replica.traces import RequestTrace

# Resolves when the request's client has gone away (for HTTP: the ASGI disconnect message).
Abandoned = Callable[[], Awaitable[object]]

# Most answers come back within milliseconds, and a watcher task per request costs more than
# the whole request path on a cheap model (it took an eighth of the trivial handler's time).
# So the deadline and the client are watched only for requests still waiting after this.
WATCH_AFTER_S = 0.05

_CLIENT_TIMEOUT = TIMEOUT_HEADER.decode()


@dataclass(frozen=True, slots=True)
class Client:
    """What the replica knows of a request's client: how it learns that the client has gone
    (`gone`), how long the client still waits (`timeout_s`, from `batchd-timeout-s`), the priority
    class it asks for (`priority`, from `batchd-priority`, as sent; None: the default class), who it
    is, for fair shares within its class (`caller`, from `batchd-fairness-id`, else what the body
    says) and its tenant, whose prefix cache and queue share it uses (`tenant`: what the router
    signed, never what the client writes; `anonymous` at an open deployment), whether it is a
    composer's call (`composed`, `batchd-called-by`), and the request's span where the replica
    traces (`trace`).
    `batchd.api.priority` reads the class."""

    gone: Abandoned | None = None
    timeout_s: float | None = None
    priority: str | None = None
    caller: str = ""
    tenant: str = ANONYMOUS_TENANT
    composed: bool = False
    trace: RequestTrace | None = None
    queue_items: int | None = None  # the most items its tenant may have waiting; None: no bound

    def asking(self, priority: str | None, caller: str | None) -> Client:
        """This client, in class `priority` and as `caller` where its headers said neither (the
        OpenAI routes' `metadata.priority` and `user`): the headers win."""
        return Client(
            self.gone,
            self.timeout_s,
            self.priority if self.priority is not None else priority,
            self.caller or caller or "",
            self.tenant,
            self.composed,
            self.trace,
            self.queue_items,
        )

    def deadline(self, admitted: float, request_timeout_s: float) -> tuple[float, str]:
        """The request's one deadline (loop time), the sooner of `request_timeout_s` after
        `admitted` and the client's timeout; and what set it, for the 504's message."""
        deadline = admitted + request_timeout_s
        if self.timeout_s is not None and admitted + self.timeout_s < deadline:
            return admitted + self.timeout_s, _CLIENT_TIMEOUT
        return deadline, "request_timeout_s"


NO_CLIENT = Client()  # a request from inside the replica (warm-up, tests): nobody to watch


@dataclass(eq=False, slots=True)
class _Watch:
    """A request waiting for its results, watched for its deadline and its client from `due` on."""

    waiter: asyncio.Future[Any]
    deadline: float  # loop time
    abandoned: Abandoned | None
    due: float  # loop time
    late: str  # what set the deadline, for the 504's message
    why: BaseException | None = None  # why the waiter was cancelled, when it was on purpose
    # Watching: a task while there is a client to watch, else only a timer for the deadline.
    watcher: asyncio.Task[None] | asyncio.TimerHandle | None = None


class Submission(Protocol):
    """One request's work in the core, from `Replica.submit`: `waiter` resolves once it has its
    results (or fails); whoever submitted it awaits it (`outcome`) or adds a callback, reads
    `results`, and `close`s it."""

    @property
    def waiter(self) -> asyncio.Future[Any]: ...

    @property
    def why(self) -> BaseException | None:
        """Why the waiter was cancelled (DeadlineExceeded, ClientDisconnected), when it was on purpose."""
        ...

    def results(self) -> list[Any]: ...

    def abandon(self, why: BaseException) -> None: ...

    def close(self) -> None: ...


async def outcome(submission: Submission) -> list[Any]:
    """Wait for `submission`'s results, in order, closing it either way. Raises what failed it:
    DeadlineExceeded, ClientDisconnected, or the exception of its items' batch."""
    try:
        await submission.waiter
        return submission.results()
    except asyncio.CancelledError:
        if submission.why is not None:  # cancelled on purpose, not by the server shutting this task down
            raise submission.why from None
        raise
    finally:
        submission.close()


@dataclass(eq=False, slots=True)
class Submitted:
    """One request's items in the queue: `waiter` resolves once every item has its result, or
    fails; it is cancelled when the request's deadline passes or its client goes away."""

    futures: list[asyncio.Future[Any]]
    waiter: asyncio.Future[Any]
    watch: _Watch
    watches: Watches
    # What the queue does once the request stops waiting: its items still queued stop counting.
    on_close: Callable[[], None] | None = None

    @property
    def why(self) -> BaseException | None:
        """Why the waiter was cancelled (DeadlineExceeded, ClientDisconnected), when it was on purpose."""
        return self.watch.why

    def results(self) -> list[Any]:
        """Once the waiter is done: the results in order, or the exception that says why there are none."""
        if self.waiter.cancelled():
            raise self.watch.why or asyncio.CancelledError()
        result = self.waiter.result()
        return [result] if len(self.futures) == 1 else list(result)

    def abandon(self, why: BaseException) -> None:
        """Stop waiting, for `why` (the client went away); `results` raises it."""
        if not self.waiter.done():
            self.watch.why = why
            self.waiter.cancel()

    def close(self) -> None:
        """Done with the request: its items that have not run never reach the model, the watch ends."""
        self.watches.remove(self.watch)
        for future in self.futures:
            future.cancel()
        if self.on_close is not None:
            self.on_close()


@dataclass(eq=False, slots=True)
class Running:
    """A request whose work runs as a task of its own (token-level generation watches its own
    deadline and client): the task is its waiter."""

    waiter: asyncio.Task[list[Any]]
    why: BaseException | None = None

    def results(self) -> list[Any]:
        if self.waiter.cancelled():
            raise self.why or asyncio.CancelledError()
        return self.waiter.result()

    def abandon(self, why: BaseException) -> None:
        if not self.waiter.done():
            self.why = why
            self.waiter.cancel()

    def close(self) -> None:
        self.waiter.cancel()


class Watches:
    """Watches each waiting request for its deadline (DeadlineExceeded) and its client
    (ClientDisconnected), and cancels its waiter when one comes first. Only requests still waiting
    WATCH_AFTER_S after admission are watched: by a task where there is a client to watch, else by
    a timer at the deadline. One timer serves every waiting request: it fires when the earliest is
    due, starts the watches of those due, and is set again for the next (a timer per request, set
    and cancelled, cost a twentieth of the event loop's time per request on a cheap model)."""

    def __init__(self) -> None:
        self._waiting: dict[_Watch, None] = {}  # not watched yet
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def add(
        self,
        futures: list[asyncio.Future[Any]],
        waiter: asyncio.Future[Any],
        deadline: float,
        abandoned: Abandoned | None,
        late: str,
    ) -> Submitted:
        """Watch the request whose items are `futures`, resolved together by `waiter`."""
        loop = asyncio.get_running_loop()
        watch = _Watch(waiter, deadline, abandoned, min(loop.time() + WATCH_AFTER_S, deadline), late)
        self._waiting[watch] = None
        if watch.due < self._timer_at:
            self._set_timer(loop, watch.due)
        return Submitted(futures, waiter, watch, self)

    def remove(self, watch: _Watch) -> None:
        self._waiting.pop(watch, None)
        if watch.watcher is not None:
            watch.watcher.cancel()

    def _set_timer(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self._start_due, loop)
        self._timer_at = at

    def _start_due(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._timer_at = None, math.inf
        now = loop.time()
        next_due = math.inf
        for watch in list(self._waiting):
            if watch.due <= now:
                del self._waiting[watch]
                if watch.abandoned is None:
                    watch.watcher = loop.call_at(watch.deadline, _expire, watch)
                else:
                    watch.watcher = loop.create_task(_watch(watch))
            else:
                next_due = min(next_due, watch.due)
        if next_due < math.inf:
            self._set_timer(loop, next_due)


async def _watch(watch: _Watch) -> None:
    try:
        async with asyncio.timeout_at(watch.deadline):
            assert watch.abandoned is not None
            await watch.abandoned()
        watch.why = ClientDisconnected.before_answer()
        watch.waiter.cancel()
    except TimeoutError:
        _expire(watch)


def _expire(watch: _Watch) -> None:
    watch.why = DeadlineExceeded.passed(watch.late)
    watch.waiter.cancel()
