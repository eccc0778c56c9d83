"""The router's ASGI application: each inference request to a replica of its model's deployment.

Per request: the model name from the path (or the JSON body, see `naming`) picks the deployment
(`directory`); with no ready replica the request is held (`holding`); then it is sent on
(`forwarding`), a text-generation request by the start of its prompt (`prefixes`), read from
its body. Everything else is the router's own (`own_routes`).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable

import orjson

from batchd.api.headers import FAIRNESS_HEADER, TIMEOUT_HEADER
from batchd.api.httpserver import closing
from batchd.api.priority import PriorityClass, PriorityError, asked_class, named_in_headers
from batchd.api.routes import Route, RouteMatch
from batchd.router.client_deadline import deadline_of
from batchd.router.client_request import (
    Body,
    ClientGone,
    ClientWatch,
    Message,
    Receive,
    Send,
    read_ahead,
    read_all,
    until_gone,
)
from batchd.router.directory import DeploymentRef, Directory
from batchd.router.errors import (
    BadRequest,
    DeadlineExceeded,
    HoldTimedOut,
    NotSynced,
    RouterError,
    http_answer,
)
from batchd.router.forwarding import Forwarder, Outbound
from batchd.router.holding import Holds
from batchd.router.loads import Loads
from batchd.router.metrics import RouterMetrics
from batchd.router.naming import DEPLOYMENT_PREFIX, json_body, named_model, routed, scoped
from batchd.router.own_routes import answer_own
from batchd.router.prefixes import LoadGuard, PrefixAsk, PrefixIndex, chunk_hashes, prompt_text
from batchd.router.settings import RouterSettings
from batchd.router.traces import RouteTrace, Tracing
from batchd.router.upstream import SendFailed, Upstream, request_headers


class Router:
    """ASGI: routes inference requests to replicas and answers its own few endpoints."""

    def __init__(
        self,
        settings: RouterSettings,
        directory: Directory,
        holds: Holds,
        loads: Loads,
        upstream: Upstream,
        metrics: RouterMetrics,
        synced: Callable[[], bool],
        rng: random.Random | None = None,
        prefixes: PrefixIndex | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self.tracing = tracing  # None: untraced (no OpenTelemetry code is loaded)
        # The caller's trace headers, which a traced router replaces with its own context.
        self._replaced = frozenset() if tracing is None else tracing.propagation_headers
        self.directory = directory
        self.holds = holds
        self.metrics = metrics
        self.synced = synced
        self.prefixes = prefixes or PrefixIndex(settings.prefix_chunks_per_replica)
        self.forwarder = Forwarder(
            settings, directory, loads, upstream, metrics, rng or random.Random(), self.prefixes
        )
        self.draining = False  # from SIGTERM on: unready, and every answer says Connection: close
        self.inflight = 0  # inference requests being routed or held now

    def begin_draining(self) -> None:
        """Turn unready at once; requests that still arrive on open connections are routed, and
        their answers tell the client to leave (see `server`)."""
        self.draining = True

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        if self.draining:
            send = closing(send)
        found = routed(method, path)
        named = scoped(path) if found is None else None
        if found is None and named is None:
            await answer_own(
                method,
                path,
                send,
                holds=self.holds,
                metrics=self.metrics,
                ready=self._ready,
                settings=self.settings,
            )
            return
        self.inflight += 1
        trace = None
        if self.tracing is not None:
            route = found.route.path if found is not None else f"{DEPLOYMENT_PREFIX}{{namespace}}/{{name}}/*"
            trace = self.tracing.request_started(method, route, path, scope["headers"])
        try:
            await self._inference(found, named, scope, receive, send, trace)
        finally:
            self.inflight -= 1

    def _ready(self) -> bool:
        return self.synced() and not self.draining

    async def _inference(
        self,
        found: RouteMatch | None,
        named: tuple[DeploymentRef, str] | None,
        scope: Message,
        receive: Receive,
        send: Send,
        trace: RouteTrace | None = None,
    ) -> None:
        """`found`: an inference route, whose model picks the deployment; else `named`: a
        deployment by name and the path its replica answers."""
        ref: DeploymentRef | None = None
        received: list[Message] = []
        failure: BaseException | None = None
        document: object = None  # the JSON body, where the router reads the model from it
        try:
            if not self.synced():
                raise NotSynced("the router has not yet read the deployments from the API server")
            if found is not None:
                model = found.model_name
                route: Route | None = found.route
                if model is None:
                    assert found.route.model_field is not None  # see `routed`
                    document = await self._json_body(found.route.model_field, receive, received)
                    model = named_model(document, found.route.model_field)
                ref = self.directory.resolve(model)
            else:
                assert named is not None
                wanted, inner = named
                model = self.directory.model_of(wanted)  # an unknown one is counted under no label
                ref = wanted
                scope = {**scope, "path": inner, "raw_path": inner.encode("latin-1")}
                inner_route = routed(scope["method"], inner)
                route = inner_route.route if inner_route is not None else None
            if trace is not None:
                trace.routed(ref.namespace, ref.name, model)
            status = await self._route(ref, model, scope, receive, send, received, route, document, trace)
        except RouterError as error:
            failure = error
            answer = http_answer(error, self.settings)
            status = answer.status
            await send({"type": "http.response.start", "status": status, "headers": answer.headers})
            await send({"type": "http.response.body", "body": answer.body})
        except ClientGone as error:
            failure, status = error, 499
        except BaseException as error:  # uvicorn cuts the connection: the span still ends
            if trace is not None:
                trace.finished(500, error)
            raise
        if trace is not None:
            trace.finished(status, failure)
        if ref is not None:
            self.metrics.requests.labels(ref.namespace, ref.name, f"{status // 100}xx").inc()

    async def _json_body(self, field: str, receive: Receive, received: list[Message]) -> object:
        """The JSON body that names the model in `field`, read into `received` no further than a
        retry keeps it anyway (`retry_body_max_bytes`)."""
        limit = self.settings.retry_body_max_bytes
        await read_ahead(receive, received, limit)
        if received[-1]["type"] == "http.disconnect":
            raise ClientGone
        if received[-1].get("more_body", False):
            raise BadRequest(f"request body: larger than {limit} bytes, so the router cannot read {field!r}")
        return json_body(b"".join(message.get("body", b"") for message in received), field)

    async def _prefix_of(
        self,
        ref: DeploymentRef,
        route: Route | None,
        headers: list[tuple[bytes, bytes]],
        receive: Receive,
        received: list[Message],
        document: object,
    ) -> PrefixAsk | None:
        """How to route a text-generation request by its prompt, for a deployment whose replicas
        cache prefixes; None for any other request, and for a body too large to read ahead
        (`retry_body_max_bytes`) or that is no JSON (its replica answers that)."""
        settings = self.settings
        record = self.directory.get(ref)
        if route is None or route.prompt_field is None or record is None or not record.prefix_cached:
            return None
        if not settings.prefix_routing:
            return None
        if document is None:
            await read_ahead(receive, received, settings.retry_body_max_bytes)
            if not read_all(received) or received[-1]["type"] == "http.disconnect":
                return None
            try:
                document = orjson.loads(b"".join(message.get("body", b"") for message in received))
            except orjson.JSONDecodeError:
                return None
        text = prompt_text(document, route.prompt_field) or ""
        caller = ""
        if record.prefix_by_caller:  # as the replicas salt their blocks: by the header alone
            caller = next((v.decode("latin-1") for k, v in headers if k.lower() == FAIRNESS_HEADER), "")
        hashes = chunk_hashes(text, caller, settings.prefix_chunk_chars, settings.prefix_max_chunks)
        slack = max(1.0, settings.prefix_load_slack * record.max_batch_size)
        return PrefixAsk(hashes, LoadGuard(slack, settings.prefix_load_ratio))

    def _class_of(self, ref: DeploymentRef, scope: Message, document: object) -> PriorityClass:
        """The priority class a request names at `ref`, read as its replicas read it (headers, else
        an OpenAI body's metadata.priority); BadRequest naming it and the classes there are when
        the deployment has no such class (then nothing is held, nor woken)."""
        priority, caller, composed = named_in_headers(scope["headers"])
        try:
            asked, _ = asked_class(self.directory.classes(ref), priority, caller, document, composed=composed)
        except PriorityError as error:
            raise BadRequest(f"model {self.directory.model_of(ref)!r}: {error}") from None
        return asked

    async def _route(
        self,
        ref: DeploymentRef,
        model: str,
        scope: Message,
        receive: Receive,
        send: Send,
        received: list[Message],
        route: Route | None = None,
        document: object = None,
        trace: RouteTrace | None = None,
    ) -> int:
        """`received`: what was read of the request so far (the body, when the model is named in
        it); `document`: that body, read as JSON."""
        deadline = deadline_of(scope["headers"])
        priority = self._class_of(ref, scope, document).priority
        if not self.directory.replicas(ref):
            held_at = time.monotonic()
            try:
                await self._hold(ref, model, receive, deadline, received, priority)
            finally:
                if trace is not None:
                    trace.held(time.monotonic() - held_at)
        prefix = await self._prefix_of(ref, route, scope["headers"], receive, received, document)
        if not received:
            received.append(await receive())
        if received[-1]["type"] == "http.disconnect":
            raise ClientGone
        body = Body(received, receive, self.settings.retry_body_max_bytes)
        target = scope["raw_path"].decode("latin-1") if scope.get("raw_path") else scope["path"]
        if scope["query_string"]:
            target = f"{target}?{scope['query_string'].decode('latin-1')}"
        watch = ClientWatch(receive) if body.complete else None
        headers = request_headers(scope["headers"], self._replaced if trace is not None else frozenset())
        request = Outbound(
            ref, model, scope["method"], target, headers, body, deadline, watch, priority, prefix, trace
        )
        try:
            return await self.forwarder.forward(request, send)
        except SendFailed:
            if request.client_left():
                raise ClientGone from None  # the router closed the replica's connection itself
            raise
        finally:
            if watch is not None:
                watch.stop()

    async def _hold(
        self,
        ref: DeploymentRef,
        model: str,
        receive: Receive,
        deadline: float | None,
        received: list[Message],
        priority: int,
    ) -> None:
        """Wait for a first replica of `ref` (in the hold's class order), reading the body meanwhile
        into `received` (up to what a retry may keep) so that a client that leaves stops waiting."""
        # Which bound ends the hold is decided here, not by reading the clock after it: the event
        # loop's timers may fire a millisecond before time.monotonic() reaches the deadline.
        client_left_s = math.inf if deadline is None else deadline - time.monotonic()
        client_bound = client_left_s < self.settings.hold_timeout_s
        timeout_s = min(client_left_s, self.settings.hold_timeout_s)
        held = asyncio.ensure_future(
            self.holds.wait(ref, model, timeout_s, priority, ready=lambda: bool(self.directory.replicas(ref)))
        )
        watching = asyncio.ensure_future(until_gone(receive, received, self.settings.retry_body_max_bytes))
        try:
            await asyncio.wait((held, watching), return_when=asyncio.FIRST_COMPLETED)
            if watching.done() and received and received[-1]["type"] == "http.disconnect":
                raise ClientGone
            try:
                await held
            except HoldTimedOut:
                if client_bound:
                    raise DeadlineExceeded(
                        f"model {model!r}: the request's {TIMEOUT_HEADER.decode()} passed while it "
                        "waited for a first replica"
                    ) from None
                raise
        finally:
            for task in (held, watching):
                task.cancel()
            await asyncio.gather(held, watching, return_exceptions=True)
