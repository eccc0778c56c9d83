"""The router's ASGI application: each inference request to a replica of its model's deployment.

Per request: the model name from the path (or the JSON body, see `naming`) picks the deployment
(`directory`); with no ready
replica the request is held (`holding`); otherwise the better of two random replicas by load
(`picker`, `loads`) gets it, streamed through (`upstream`). A replica that refused it before
accepting it, or that could not be reached at all, makes way for one other replica; nothing a
replica may have accepted is sent twice. Besides inference: `GET /held` (what waits for a first
replica, for the operator), `/metrics`, `/healthz` and `/readyz`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from batchd.api.headers import TIMEOUT_HEADER
from batchd.api.httpserver import closing
from batchd.api.routes import RouteMatch
from batchd.router.client_deadline import answer_bound_s, deadline_of, remaining_header
from batchd.router.directory import DeploymentRef, Directory
from batchd.router.errors import (
    BadRequest,
    DeadlineExceeded,
    HoldRefused,
    NoRoute,
    NotSynced,
    RouterError,
    Unreachable,
    UpstreamFailed,
    http_answer,
)
from batchd.router.holding import Holds
from batchd.router.loads import Loads
from batchd.router.metrics import RouterMetrics
from batchd.router.naming import model_in_body, routed, scoped
from batchd.router.picker import pick
from batchd.router.settings import RouterSettings
from batchd.router.upstream import (
    Body,
    ClientGone,
    ClientWatch,
    ConnectFailed,
    Message,
    Receive,
    Send,
    SendFailed,
    Upstream,
    relay,
    request_headers,
)

logger = logging.getLogger(__name__)

_JSON = [(b"content-type", b"application/json")]
ROUTES_HELP = (
    "the inference routes that name a model (POST /v1/models/NAME:predict, /v2/models/NAME/infer, ...)"
)


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
    ) -> None:
        self.settings = settings
        self.directory = directory
        self.holds = holds
        self.loads = loads
        self.upstream = upstream
        self.metrics = metrics
        self.synced = synced
        self.rng = rng or random.Random()
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
            await self._own(method, path, send)
            return
        self.inflight += 1
        try:
            await self._inference(found, named, scope, receive, send)
        finally:
            self.inflight -= 1

    async def _inference(
        self,
        found: RouteMatch | None,
        named: tuple[DeploymentRef, str] | None,
        scope: Message,
        receive: Receive,
        send: Send,
    ) -> None:
        """`found`: an inference route, whose model picks the deployment; else `named`: a
        deployment by name and the path its replica answers."""
        ref: DeploymentRef | None = None
        received: list[Message] = []
        try:
            if not self.synced():
                raise NotSynced("the router has not yet read the deployments from the API server")
            if found is not None:
                model = found.model_name
                if model is None:
                    assert found.route.model_field is not None  # see `routed`
                    model = await self._model_in_body(found.route.model_field, receive, received)
                ref = self.directory.resolve(model)
            else:
                assert named is not None
                wanted, inner = named
                model = self.directory.model_of(wanted)  # an unknown one is counted under no label
                ref = wanted
                scope = {**scope, "path": inner, "raw_path": inner.encode("latin-1")}
            status = await self._route(ref, model, scope, receive, send, received)
        except RouterError as error:
            answer = http_answer(error, self.settings)
            status = answer.status
            await send({"type": "http.response.start", "status": status, "headers": answer.headers})
            await send({"type": "http.response.body", "body": answer.body})
        except ClientGone:
            status = 499
        if ref is not None:
            self.metrics.requests.labels(ref.namespace, ref.name, f"{status // 100}xx").inc()

    async def _model_in_body(self, field: str, receive: Receive, received: list[Message]) -> str:
        """The model a JSON body names in `field`, reading the body into `received` no further
        than a retry keeps it anyway (`retry_body_max_bytes`)."""
        limit = self.settings.retry_body_max_bytes
        await self._read_ahead(receive, received, limit)
        if received[-1]["type"] == "http.disconnect":
            raise ClientGone
        if received[-1].get("more_body", False):
            raise BadRequest(f"request body: larger than {limit} bytes, so the router cannot read {field!r}")
        return model_in_body(b"".join(message.get("body", b"") for message in received), field)

    async def _route(
        self,
        ref: DeploymentRef,
        model: str,
        scope: Message,
        receive: Receive,
        send: Send,
        received: list[Message],
    ) -> int:
        """`received`: what was read of the request so far (the body, when the model is named in it)."""
        deadline = deadline_of(scope["headers"])
        if not self.directory.replicas(ref):
            await self._hold(ref, model, receive, deadline, received)
        if not received:
            received.append(await receive())
        if received[-1]["type"] == "http.disconnect":
            raise ClientGone
        body = Body(received, receive, self.settings.retry_body_max_bytes)
        headers = request_headers(scope["headers"])
        target = scope["raw_path"].decode("latin-1") if scope.get("raw_path") else scope["path"]
        if scope["query_string"]:
            target = f"{target}?{scope['query_string'].decode('latin-1')}"
        watch = ClientWatch(receive) if body.complete else None
        try:
            return await self._forward(ref, model, scope, send, body, headers, target, deadline, watch)
        except SendFailed:
            if watch is not None and watch.left:
                raise ClientGone from None  # the router closed the replica's connection itself
            raise
        finally:
            if watch is not None:
                watch.stop()

    async def _forward(
        self,
        ref: DeploymentRef,
        model: str,
        scope: Message,
        send: Send,
        body: Body,
        headers: tuple[bytes, int | None],
        target: str,
        deadline: float | None,
        watch: ClientWatch | None,
    ) -> int:
        """To the better of two replicas; to one other after a refusal or no connection at all."""
        labels = (ref.namespace, ref.name)
        tried: list[str] = []
        while True:
            replica = self._pick(ref, tried)
            if replica is None:
                raise Unreachable(
                    f"model {model!r}: no replica of {ref} could be reached (tried {', '.join(tried)})"
                )
            tried.append(replica)
            last_chance = len(tried) > 1 or not body.replayable
            extra = b""
            if deadline is not None:
                if deadline <= time.monotonic():
                    raise DeadlineExceeded(f"model {model!r}: the request's {TIMEOUT_HEADER.decode()} passed")
                extra = remaining_header(deadline)
            answer_within_s = answer_bound_s(self.directory.request_timeout_s(ref), self.settings, deadline)
            self.loads.begin(replica)
            try:
                try:
                    async with asyncio.timeout(answer_within_s):
                        response = await self.upstream.send(
                            replica, scope["method"], target, headers, body, extra, watch
                        )
                except TimeoutError:
                    raise DeadlineExceeded(
                        f"model {model!r}: replica {replica} of {ref} did not answer within "
                        f"{answer_within_s:.3g} s (its request_timeout_s, or the request's "
                        f"{TIMEOUT_HEADER.decode()}); not sent again"
                    ) from None
                except ConnectFailed as error:
                    if watch is not None and watch.left:
                        raise ClientGone from None
                    self.loads.unreachable(replica)
                    if last_chance:
                        raise Unreachable(
                            f"model {model!r}: no replica of {ref} could be reached: {error}"
                        ) from None
                    self.metrics.retries.labels(*labels, "unreachable").inc()
                    continue
                except SendFailed as error:
                    if watch is not None and watch.left:
                        raise
                    raise UpstreamFailed(
                        f"model {model!r}: replica {replica} of {ref} failed after the request was sent; "
                        f"not sent again, as it may have been computed ({error})"
                    ) from None
                try:
                    if not last_chance and response.refused() and self._others(ref, tried):
                        await response.read()  # a short answer: the connection stays usable
                        self.metrics.retries.labels(*labels, "refused").inc()
                        continue
                    await relay(response, send)
                    return response.status
                except SendFailed as error:
                    if response.started or (watch is not None and watch.left):
                        raise  # uvicorn cuts the client's connection: the answer is incomplete
                    raise UpstreamFailed(
                        f"model {model!r}: replica {replica} of {ref} failed while answering; "
                        f"not sent again, as it may have been computed ({error})"
                    ) from None
                finally:
                    response.release()
            finally:
                self.loads.end(replica)

    def _others(self, ref: DeploymentRef, tried: list[str]) -> bool:
        return any(replica not in tried for replica in self.directory.replicas(ref))

    async def _hold(
        self,
        ref: DeploymentRef,
        model: str,
        receive: Receive,
        deadline: float | None,
        received: list[Message],
    ) -> None:
        """Wait for a first replica of `ref`, reading the body meanwhile into `received` (up to
        what a retry may keep) so that a client that leaves stops waiting."""
        timeout_s = self.settings.hold_timeout_s
        if deadline is not None:
            timeout_s = min(timeout_s, deadline - time.monotonic())
        held = asyncio.ensure_future(self.holds.wait(ref, model, timeout_s))
        watching = asyncio.ensure_future(self._watch_client(receive, received))
        try:
            await asyncio.wait((held, watching), return_when=asyncio.FIRST_COMPLETED)
            if watching.done() and received and received[-1]["type"] == "http.disconnect":
                raise ClientGone
            try:
                await held
            except HoldRefused:
                if deadline is not None and deadline <= time.monotonic():
                    raise DeadlineExceeded(
                        f"model {model!r}: the request's {TIMEOUT_HEADER.decode()} passed while it "
                        "waited for a first replica"
                    ) from None
                raise
        finally:
            for task in (held, watching):
                task.cancel()
            await asyncio.gather(held, watching, return_exceptions=True)

    async def _watch_client(self, receive: Receive, received: list[Message]) -> None:
        """Read the body into `received`; then the next message can only say the client left."""
        limit = self.settings.retry_body_max_bytes
        if not _read_all(received):
            await self._read_ahead(receive, received, limit)
        if _read_all(received) and received[-1]["type"] != "http.disconnect":
            received.append(await receive())

    @staticmethod
    async def _read_ahead(receive: Receive, received: list[Message], limit: int) -> None:
        """Read the body into `received` until it is complete, the client left, or more than
        `limit` bytes are in: the rest streams once a replica is there."""
        size = sum(len(message.get("body", b"")) for message in received)
        while not _read_all(received) and size <= limit:
            message = await receive()
            received.append(message)
            size += len(message.get("body", b""))

    def _pick(self, ref: DeploymentRef, tried: list[str]) -> str | None:
        replicas = self.directory.replicas(ref)
        ready = [replica for replica in replicas if self.loads.ready(replica)] or replicas
        candidates = [replica for replica in ready if replica not in tried]
        replica = pick(candidates, self.loads.items, self.rng)
        if replica is not None:
            choice = "two_choices" if len(candidates) > 1 else "only_choice"
            self.metrics.decisions.labels(ref.namespace, ref.name, choice).inc()
        return replica

    async def _own(self, method: str, path: str, send: Send) -> None:
        if method == "GET" and path == "/held":
            await _send(send, 200, orjson.dumps({"deployments": self.holds.snapshot()}), _JSON)
        elif method == "GET" and path == "/metrics":
            headers = [(b"content-type", CONTENT_TYPE_LATEST.encode())]
            await _send(send, 200, generate_latest(self.metrics.registry), headers)
        elif method == "GET" and path == "/healthz":
            await _send(send, 200, b'{"live":true}', _JSON)
        elif method == "GET" and path == "/readyz":
            ready = self.synced() and not self.draining
            await _send(send, 200 if ready else 503, orjson.dumps({"ready": ready}), _JSON)
        else:
            answer = http_answer(
                NoRoute(f"no route for {method} {path}; the router forwards {ROUTES_HELP}"), self.settings
            )
            await _send(send, answer.status, answer.body, answer.headers)


def _read_all(received: list[Message]) -> bool:
    """Whether `received` holds the whole body, or the client's leaving."""
    return bool(received) and (
        received[-1]["type"] == "http.disconnect" or not received[-1].get("more_body", False)
    )


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
