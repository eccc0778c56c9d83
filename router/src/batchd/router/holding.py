"""Requests held while their deployment has no ready replica: scale from zero, router side.

A deployment at zero replicas (or whose replicas all went) still gets requests. Rather than fail
them, the router holds each until a first replica is ready, bounded in count per deployment
and in time; what is held is what the operator reads (`GET /held`) to start a replica. When the
deployment is deleted, its held requests fail with an error naming the model.

The hold keeps the replica's order between priority levels (the classes of one priority are
one level): a full hold makes room for a request of a strictly higher priority by refusing the
most recently held request of the lowest priority (503 with Retry-After), never for an equal
one; a sheddable class (negative priority) is held only while the hold holds less than
`SHEDDABLE_SHARE` of its bound (counted before it joins); a first replica gets the held requests
higher priorities first, each level in the order it came. A request whose client left, or whose
time passed, leaves the hold at once. The router reads a request's class as its replicas do
(`batchd.api.priority`) and refuses one its deployment lacks before holding anything.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from batchd.api.spec import SHEDDABLE_SHARE
from batchd.router.directory import DeploymentRef
from batchd.router.errors import HoldDisplaced, HoldRefused, HoldTimedOut, UnknownModel
from batchd.router.metrics import RouterMetrics


@dataclass(slots=True)
class _Waiting:
    model: str
    futures: set[asyncio.Future[None]] = field(default_factory=set)
    since: dict[asyncio.Future[None], float] = field(default_factory=dict)
    priority: dict[asyncio.Future[None], int] = field(default_factory=dict)

    def by_class(self) -> list[asyncio.Future[None]]:
        """Higher classes first, and within a class the longest held first."""
        return sorted(self.futures, key=lambda future: (-self.priority[future], self.since[future]))


class Holds:
    """The requests held per deployment; `release` and `fail` are the directory's listener calls."""

    def __init__(self, max_per_deployment: int, metrics: RouterMetrics) -> None:
        self.max_per_deployment = max_per_deployment
        self.metrics = metrics
        self._waiting: dict[DeploymentRef, _Waiting] = {}

    async def wait(
        self,
        ref: DeploymentRef,
        model: str,
        timeout_s: float,
        priority: int = 0,
        ready: Callable[[], bool] = lambda: False,
    ) -> None:
        """Return once `ref` has a ready replica; HoldRefused when the hold is full (or, for a
        sheddable `priority`, past its share) or a higher class took this request's place,
        HoldTimedOut when `timeout_s` passed, UnknownModel when the deployment is deleted meanwhile.

        `ready` says whether `ref` has a replica now: it is asked in the step that joins the hold,
        because a release between the caller's own look and this wait's first step finds nothing
        to release."""
        if ready():
            return
        labels = (ref.namespace, ref.name)
        waiting = self._waiting.setdefault(ref, _Waiting(model))
        bound = self.max_per_deployment
        if priority < 0 and len(waiting.futures) >= math.floor(bound * SHEDDABLE_SHARE):
            self.metrics.holds.labels(*labels, "shed").inc()
            raise HoldRefused(
                f"model {model!r}: no replica is ready and {len(waiting.futures)} requests already wait; "
                f"a sheddable class is held only while fewer than {math.floor(bound * SHEDDABLE_SHARE)} do"
            )
        if len(waiting.futures) >= bound and not self._make_room(waiting, priority):
            self.metrics.holds.labels(*labels, "full").inc()
            raise HoldRefused(
                f"model {model!r}: no replica is ready and {bound} requests already wait for one; retry later"
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        started = time.monotonic()
        waiting.futures.add(future)
        waiting.since[future] = started
        waiting.priority[future] = priority
        self.metrics.held.labels(*labels).inc()
        outcome = "released"
        try:
            async with asyncio.timeout(timeout_s):
                await future
        except TimeoutError:
            outcome = "timeout"
            raise HoldTimedOut(
                f"model {model!r}: no replica became ready within {timeout_s:g} s; retry later"
            ) from None
        except UnknownModel:
            outcome = "deleted"
            raise
        except HoldDisplaced:
            outcome = "displaced"
            raise
        except HoldRefused:
            outcome = "shutdown"  # refused before its time: the router's drain bound passed
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"  # the client went away, or its deadline passed
            raise
        finally:
            waiting.futures.discard(future)
            waiting.since.pop(future, None)
            waiting.priority.pop(future, None)
            if not waiting.futures and self._waiting.get(ref) is waiting:
                del self._waiting[ref]
            self.metrics.held.labels(*labels).dec()
            self.metrics.hold_seconds.labels(*labels).observe(time.monotonic() - started)
            self.metrics.holds.labels(*labels, outcome).inc()
        self.metrics.cold_starts.labels(*labels).inc()

    @staticmethod
    def _make_room(waiting: _Waiting, priority: int) -> bool:
        """Refuse the most recently held request of the lowest class, if that class is below
        `priority`; whether there is room now."""
        lowest = min(waiting.futures, key=lambda f: (waiting.priority[f], -waiting.since[f]), default=None)
        if lowest is None or waiting.priority[lowest] >= priority or lowest.done():
            return False
        lowest.set_exception(
            HoldDisplaced(
                f"model {waiting.model!r}: a request of a higher priority class took its place; retry"
            )
        )
        waiting.futures.discard(lowest)  # its own wait() clears the rest as it ends
        return True

    def release(self, ref: DeploymentRef) -> None:
        """A replica is ready: every request held for `ref` goes, higher classes first."""
        waiting = self._waiting.get(ref)
        for future in waiting.by_class() if waiting else ():
            if not future.done():
                future.set_result(None)

    def fail(self, ref: DeploymentRef, model: str) -> None:
        """The deployment was deleted: every request held for it fails, naming the model."""
        waiting = self._waiting.get(ref)
        for future in waiting.futures if waiting else ():
            if not future.done():
                future.set_exception(
                    UnknownModel(f"model {model!r}: its BatchedDeployment {ref} was deleted")
                )

    def refuse_all(self, why: str) -> None:
        """Every held request, of every deployment, gets a 503 with Retry-After saying `why`."""
        for waiting in self._waiting.values():
            for future in waiting.futures:
                if not future.done():
                    future.set_exception(HoldRefused(f"model {waiting.model!r}: {why}"))

    @property
    def count(self) -> int:
        """Requests held now, over every deployment."""
        return sum(len(waiting.futures) for waiting in self._waiting.values())

    def snapshot(self) -> list[dict[str, object]]:
        """What is held, per deployment: the operator's signal to start a first replica."""
        now = time.monotonic()
        return [
            {
                "namespace": ref.namespace,
                "name": ref.name,
                "model": waiting.model,
                "held_requests": len(waiting.futures),
                "oldest_held_s": round(now - min(waiting.since.values()), 3),
            }
            for ref, waiting in sorted(self._waiting.items())
            if waiting.futures
        ]
