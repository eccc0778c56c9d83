"""The request path (`Proxy`, in ASGI): each inference request to a replica of its model's deployment.

Per request: the model name from the path (or the JSON body, see `naming`) picks the deployment
(`directory`); with no ready replica the request is held (`holding`); then it is sent on
(`forwarding`), a text-generation request by the start of its prompt (`prefixes`), read from
its body. Everything else is the router's own (`own_routes`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable

import orjson

from batchd.api.access import NotEntitled, granted_class
from batchd.api.headers import CLIENT_IDENTITY_HEADERS, TIMEOUT_HEADER
from batchd.api.httpserver import closing
from batchd.api.pod import access_secret_name
from batchd.api.priority import PriorityClass, PriorityError, named_in_body, named_in_headers
from batchd.api.routes import Route, RouteMatch
from batchd.api.stamp import Stamp, request_target
from batchd.api.tracecontext import TRACEPARENT, TRACESTATE, unrecorded_headers
from batchd.api.tracecontext import caller_of as trace_parent_of
from batchd.router.access import (
    Caller,
    Forbidden,
    Keyring,
    NoSigningKey,
    Refused,
    Reviews,
    caller_of,
    stamped,
)
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
    NoRoute,
    NotSynced,
    RouterError,
    http_answer,
)
from batchd.router.forwarding import Forwarder, Outbound
from batchd.router.holding import Holds
from batchd.router.loads import Loads
from batchd.router.metrics import RouterMetrics
from batchd.router.naming import DEPLOYMENT_PREFIX, ROUTES, json_body, named_model, routed, scoped
from batchd.router.own_routes import answer_admin, answer_own
from batchd.router.prefixes import LoadGuard, PrefixAsk, PrefixIndex, chunk_hashes, prompt_text
from batchd.router.quotas import Quotas, tokens_used
from batchd.router.settings import RouterSettings
from batchd.router.traces import RouteTrace, Tracing
from batchd.router.upstream import SendFailed, Upstream, request_headers

logger = logging.getLogger(__name__)


class Proxy:
    """The request path, in ASGI: each inference request to a replica, and the router's own few
    endpoints (the lifespan and what runs beside requests are `app.RouterApp`'s)."""

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
        keyring: Keyring | None = None,
        reviews: Reviews | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        self.settings = settings
        self.keyring = keyring or Keyring()  # each deployment's signing key and API key digests
        self.reviews = reviews  # None: ServiceAccount tokens are no credential
        self.quotas = quotas or Quotas()
        self.tracing = tracing  # None: untraced (no OpenTelemetry code is loaded)
        # What the replica never gets as the client sent it: the router's own stamp goes in its
        # place, and a traced router's own context in place of the caller's.
        replaced = frozenset() if tracing is None else tracing.propagation_headers
        self._stripped = CLIENT_IDENTITY_HEADERS | replaced
        self._stripped_context = self._stripped | {TRACEPARENT, TRACESTATE}  # an untrusted caller's
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
            await answer_own(method, path, send, ready=self._ready, settings=self.settings)
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

    async def admin(self, scope: Message, send: Send) -> None:
        """A request to the admin port (`admin_port`): the scraper's and the operator's."""
        method, path = scope["method"], scope["path"]
        await answer_admin(method, path, send, holds=self.holds, metrics=self.metrics, settings=self.settings)

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
                inner_route = ROUTES.match(scope["method"], inner)
                if inner_route is None or (  # metrics, load, docs: a replica's, never a client's
                    inner_route.model_name is not None
                    and (not inner_route.model_name or "/" in inner_route.model_name)
                ):
                    raise NoRoute(
                        f"no route for {scope['method']} {inner} of deployment {wanted}; the router "
                        "forwards a deployment's inference routes only"
                    )
                model = self.directory.model_of(wanted)  # an unknown one is counted under no label
                ref = wanted
                scope = {**scope, "path": inner, "raw_path": inner.encode("latin-1")}
                route = inner_route.route
            if trace is not None:
                trace.routed(ref.namespace, ref.name, model)
            status = await self._route(ref, model, scope, receive, send, received, route, document, trace)
        except RouterError as error:
            failure = error
            answer = http_answer(error, self.settings)
            status = answer.status
            if isinstance(error, Refused) and ref is not None:
                self._refused(ref, error, status)
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

    def _refused(self, ref: DeploymentRef, error: Refused, status: int) -> None:
        """Count and log a refusal: its reason and tenant (a declared name), never the credential."""
        self.metrics.refusals.labels(ref.namespace, ref.name, error.tenant, str(status), error.reason).inc()
        logger.info(
            "refused a request to %s (%d %s, tenant %s): %s", ref, status, error.reason, error.tenant, error
        )

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
        tenant: str,
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
        # As the replicas salt their blocks: by the authenticated tenant, never a client's header.
        salt = tenant if record.prefix_by_caller else ""
        hashes = chunk_hashes(text, salt, settings.prefix_chunk_chars, settings.prefix_max_chunks)
        slack = max(1.0, settings.prefix_load_slack * record.max_batch_size)
        return PrefixAsk(hashes, LoadGuard(slack, settings.prefix_load_ratio))

    def _class_of(
        self, ref: DeploymentRef, scope: Message, document: object, caller: Caller
    ) -> tuple[PriorityClass, str]:
        """The class `caller` is granted at `ref` for what the request asks (the batchd-priority
        header, else an OpenAI body's metadata.priority), and who within its tenant sent it (the
        batchd-fairness-id header, else the body's `user`, else ""). BadRequest for a class the
        deployment lacks, Forbidden for one the tenant may not use; each names only the classes
        the tenant may use (then nothing is held, nor woken)."""
        priority, fairness, _ = named_in_headers(scope["headers"])
        model = self.directory.model_of(ref)
        try:
            in_body, user = named_in_body(document) if document is not None else (None, None)
            asked = priority.decode("latin-1") if priority is not None else in_body
            granted = granted_class(
                caller.tenant, self.directory.classes(ref), asked, composed=bool(caller.called_by)
            )
        except PriorityError as error:
            raise BadRequest(f"model {model!r}: {error}") from None
        except NotEntitled as error:
            raise Forbidden(f"model {model!r}: {error}", "not_entitled", caller.tenant.name) from None
        who = fairness.decode("latin-1") if fairness is not None else (user or "")
        return granted, who

    async def _caller(self, ref: DeploymentRef, scope: Message) -> Caller:
        record = self.directory.record(ref)
        return await caller_of(
            record.access,
            ref,
            scope["headers"],
            self.keyring.get(ref),
            self.reviews,
            lambda other: self.directory.get(other) is not None,
        )

    def _charge(self, ref: DeploymentRef, caller: Caller) -> Callable[[bytes], None] | None:
        """What charges an answer's tokens to the tenant's quota; None where it has none."""
        tenant = caller.tenant
        if tenant.tokens_per_minute is None:
            return None
        return lambda body: self.quotas.charge(ref, tenant, tokens_used(body))

    def _signing_key(self, ref: DeploymentRef) -> bytes | None:
        """The key to sign `ref`'s stamps with. None for an open deployment whose Secret is not read
        yet: its replicas take unstamped requests as `anonymous`, which is all it would stamp.
        NoSigningKey for any other: its replicas would refuse what is not signed."""
        credentials = self.keyring.get(ref)
        key = credentials.signing_key if credentials is not None else None
        if key is None and not self.directory.record(ref).access.open:
            raise NoSigningKey(
                f"deployment {ref}: its access Secret {access_secret_name(ref.name)} is not read yet"
            )
        return key

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
        key = self._signing_key(ref)  # first: a key is no caller's until the router has read it
        caller = await self._caller(ref, scope)
        if trace is not None:
            trace.caller_trusted(caller.tenant.trust_traces)
        granted, who = self._class_of(ref, scope, document, caller)
        self.quotas.admit(ref, caller.tenant)
        priority = granted.priority
        if not self.directory.replicas(ref):
            held_at = time.monotonic()
            try:
                await self._hold(ref, model, receive, deadline, received, priority)
            finally:
                if trace is not None:
                    trace.held(time.monotonic() - held_at)
        prefix = await self._prefix_of(ref, route, caller.tenant.name, receive, received, document)
        if not received:
            received.append(await receive())
        if received[-1]["type"] == "http.disconnect":
            raise ClientGone
        body = Body(received, receive, self.settings.retry_body_max_bytes)
        target = request_target(scope)
        watch = ClientWatch(receive) if body.complete else None
        stripped, context = self._stripped, b""
        if trace is None and not caller.tenant.trust_traces:
            # Untraced, the router still keeps an untrusted caller's sampled flag from the replica.
            parent = trace_parent_of(scope["headers"])
            if parent is not None and parent.sampled:
                stripped, context = self._stripped_context, unrecorded_headers(parent)
        lines, length = request_headers(scope["headers"], stripped)
        lines += context
        lines += stamped(
            key, scope["method"], target, Stamp(caller.tenant.name, granted.name, who, caller.called_by)
        )
        headers = (lines, length)
        request = Outbound(
            ref,
            model,
            scope["method"],
            target,
            headers,
            body,
            deadline,
            watch,
            priority,
            prefix,
            trace,
            self._charge(ref, caller),
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
