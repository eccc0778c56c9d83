"""One request sent on to a replica of its deployment: the better of two by load (`picker`,
`loads`), or, for a text-generation request, the replica that holds the start of its prompt
within the load guard (`prefixes`); after a refusal before acceptance or no connection at all,
one other. Nothing a replica may have accepted is sent twice, and no replica is waited on past
the request's bound (`client_deadline`)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from batchd.api.headers import TIMEOUT_HEADER
from batchd.router.client_deadline import answer_bound_s, remaining_header
from batchd.router.client_request import Body, ClientGone, ClientWatch, Send
from batchd.router.directory import DeploymentRef, Directory
from batchd.router.errors import DeadlineExceeded, Unreachable, UpstreamFailed
from batchd.router.loads import Loads
from batchd.router.metrics import RouterMetrics
from batchd.router.picker import pick
from batchd.router.prefixes import HIT, PrefixAsk, PrefixIndex, pick_by_prefix
from batchd.router.settings import RouterSettings
from batchd.router.traces import RouteTrace
from batchd.router.upstream import Answer, ConnectFailed, SendFailed, Upstream, relay


@dataclass(frozen=True, slots=True)
class Outbound:
    """A request ready to go to a replica of `ref`: what is sent, and what bounds it."""

    ref: DeploymentRef
    model: str  # for messages
    method: str
    target: str  # path and query
    headers: tuple[bytes, int | None]  # as `upstream.request_headers` makes them
    body: Body
    deadline: float | None  # time.monotonic() by which the client wants its answer
    watch: ClientWatch | None
    priority: int = 0  # of its class at the deployment; negative: sheddable, never retried
    prefix: PrefixAsk | None = None  # a text-generation request to route by its prompt
    trace: RouteTrace | None = None  # its span, where the router traces
    # Told the body of a whole (not streamed) answer it relays: what charges tokens to a quota.
    answered: Callable[[bytes], None] | None = None

    def client_left(self) -> bool:
        return self.watch is not None and self.watch.left


class _TryAnother(Exception):
    """This replica refused the request before accepting it, or could not be reached."""


class Forwarder:
    """Sends requests to replicas and relays their answers; the status relayed."""

    def __init__(
        self,
        settings: RouterSettings,
        directory: Directory,
        loads: Loads,
        upstream: Upstream,
        metrics: RouterMetrics,
        rng: random.Random,
        prefixes: PrefixIndex | None = None,
    ) -> None:
        self.settings = settings
        self.directory = directory
        self.loads = loads
        self.upstream = upstream
        self.metrics = metrics
        self.rng = rng
        self.prefixes = prefixes or PrefixIndex(settings.prefix_chunks_per_replica)

    async def forward(self, request: Outbound, send: Send) -> int:
        """To the better of two replicas; to one other after a refusal or no connection at all."""
        ref, model = request.ref, request.model
        tried: list[str] = []
        pool = self._revision(ref, request.trace)
        while True:
            replica = self._pick(ref, pool, tried, request.prefix, request.trace)
            if replica is None:
                raise Unreachable(
                    f"model {model!r}: no replica of {ref} could be reached (tried {', '.join(tried)})"
                )
            tried.append(replica)
            # A sheddable request's refusal is its answer: retried, it would take a place elsewhere
            # that the replicas keep for the classes that must be served.
            last_chance = len(tried) > 1 or not request.body.replayable or request.priority < 0
            self.loads.begin(replica)
            try:
                return await self._attempt(request, replica, send, last_chance, pool, tried)
            except _TryAnother:
                continue
            finally:
                self.loads.end(replica)

    async def _attempt(
        self,
        request: Outbound,
        replica: str,
        send: Send,
        last_chance: bool,
        pool: tuple[str, ...],
        tried: list[str],
    ) -> int:
        """One replica's turn: the answer relayed (its status), or _TryAnother."""
        response = await self._send(request, replica, last_chance)
        try:
            if not last_chance and response.refused() and self._others(request.ref, pool, tried):
                await response.read()  # a short answer: the connection stays usable
                self.metrics.retries.labels(request.ref.namespace, request.ref.name, "refused").inc()
                if request.trace is not None:
                    request.trace.retried(replica, "refused")
                raise _TryAnother
            await relay(response, send, request.answered if response.status == 200 else None)
            return response.status
        except SendFailed as error:
            if response.started or request.client_left():
                raise  # uvicorn cuts the client's connection: the answer is incomplete
            raise UpstreamFailed(
                f"model {request.model!r}: replica {replica} of {request.ref} failed while answering; "
                f"not sent again, as it may have been computed ({error})"
            ) from None
        finally:
            response.release()

    async def _send(self, request: Outbound, replica: str, last_chance: bool) -> Answer:
        """The request written to `replica`, its answer's head read, within the request's bound."""
        ref, model = request.ref, request.model
        extra = b""
        if request.deadline is not None:
            if request.deadline <= time.monotonic():
                raise DeadlineExceeded(f"model {model!r}: the request's {TIMEOUT_HEADER.decode()} passed")
            extra = remaining_header(request.deadline)
        if request.trace is not None:
            extra += request.trace.upstream_headers()
        within_s = answer_bound_s(self.directory.request_timeout_s(ref), self.settings, request.deadline)
        try:
            async with asyncio.timeout(within_s):
                return await self.upstream.send(
                    replica,
                    request.method,
                    request.target,
                    request.headers,
                    request.body,
                    extra,
                    request.watch,
                )
        except TimeoutError:
            raise DeadlineExceeded(
                f"model {model!r}: replica {replica} of {ref} did not answer within {within_s:.3g} s "
                f"(its request_timeout_s, or the request's {TIMEOUT_HEADER.decode()}); not sent again"
            ) from None
        except ConnectFailed as error:
            if request.client_left():
                raise ClientGone from None
            self.loads.unreachable(replica)
            if last_chance:
                raise Unreachable(f"model {model!r}: no replica of {ref} could be reached: {error}") from None
            self.metrics.retries.labels(ref.namespace, ref.name, "unreachable").inc()
            if request.trace is not None:
                request.trace.retried(replica, "unreachable")
            raise _TryAnother from None
        except SendFailed as error:
            if request.client_left():
                raise
            raise UpstreamFailed(
                f"model {model!r}: replica {replica} of {ref} failed after the request was sent; "
                f"not sent again, as it may have been computed ({error})"
            ) from None

    def _revision(self, ref: DeploymentRef, trace: RouteTrace | None) -> tuple[str, ...]:
        """The replicas of the revision that takes this request: during a canary rollout, the
        canary's with its share's chance, else the stable revision's."""
        canaries, percent = self.directory.canary(ref)
        if not percent:
            return self.directory.replicas(ref)  # no rollout: nothing drawn, nothing counted
        canary = self.rng.random() * 100 < percent
        self.metrics.revisions.labels(ref.namespace, ref.name, "canary" if canary else "stable").inc()
        if trace is not None:
            trace.revision(canary)
        return canaries if canary else self.directory.replicas(ref)

    def _others(self, ref: DeploymentRef, pool: tuple[str, ...], tried: list[str]) -> bool:
        """Whether a retry has somewhere to go: the revision's replicas, then (as `_pick` falls
        back) the stable revision's."""
        return any(replica not in tried for replica in (*pool, *self.directory.replicas(ref)))

    def _pick(
        self,
        ref: DeploymentRef,
        pool: tuple[str, ...],
        tried: list[str],
        prefix: PrefixAsk | None,
        trace: RouteTrace | None,
    ) -> str | None:
        """The better of two of the revision's replicas (or, by its prompt, the one holding its
        prefix), less those tried; when none is left (a canary scaled away meanwhile), of the
        stable revision's."""
        if not any(replica not in tried for replica in pool):
            pool = self.directory.replicas(ref)
        ready = [replica for replica in pool if self.loads.ready(replica)] or pool
        candidates = [replica for replica in ready if replica not in tried]
        if prefix is not None:
            matched = self.prefixes.matched(candidates, prefix.hashes)
            replica, outcome = pick_by_prefix(candidates, matched, self.loads.items, prefix.guard, self.rng)
            if not tried:  # each request counted once, by how its first replica was chosen
                self.metrics.prefix_routes.labels(ref.namespace, ref.name, outcome).inc()
            if replica is not None:
                self.prefixes.record(replica, prefix.hashes)
        else:
            replica, outcome = pick(candidates, self.loads.items, self.rng), ""
        if replica is not None:
            choice = "prefix" if outcome == HIT else "two_choices" if len(candidates) > 1 else "only_choice"
            self.metrics.decisions.labels(ref.namespace, ref.name, choice).inc()
            if trace is not None:
                trace.picked(replica, candidates)
        return replica
