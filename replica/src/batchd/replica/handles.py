"""Handles to other BatchedDeployments: how one model calls another (Ray Serve's model composition).

A handler names the deployments it calls in `model.calls` (`{embedder: minilm}`), and its
constructor receives one `DeploymentHandle` per alias (`def __init__(self, embedder)`), as Ray
Serve passes handles to a composed deployment. `await handle.remote(item)` sends one item to that
deployment's Service over KServe V1, where it waits in the callee's queue beside every other
caller's items: the calls a composer makes for many requests are batched together by the callee.
`await handle.remote_many(items)` sends several items in one request, and `await
handle.embed(texts)` sends texts to an embedding model's OpenAI route (`/v1/embeddings`) and
returns their vectors. None blocks anything: an
`async def` handler runs on an event loop of its own (`models.executor`), where it awaits its
calls while the server keeps admitting requests and, with `max_concurrent_batches` > 1, running
other batches.

A call carries the class and the caller of the batch it was made for (`batchd-priority`,
`batchd-fairness-id`: the highest class among the batch's requests, and their caller when they
share one) and says it is a composer's (`batchd-called-by`): the callee orders it like any other
request of that class, so a high-class request never waits behind the callee's low-class queue (a
priority inversion). A class the callee lacks is its default class there.

Every call is bounded and every failure names the callee. A call gives up when the batch it was
made for is no longer awaited (`deadlines`: the composer's own `request_timeout_s`), so a slow
callee never holds the composer's model past its requests. What comes back:
`CalleeOverloaded` (the callee answered 503: full queue, loading, draining; with its Retry-After),
`CalleeUnavailable` (nothing answered at its address), `CalleeTimeout` (no answer in time, or
its own 504) and `CalleeError` (anything else it answered). Left uncaught, they answer the
composer's client 503 + Retry-After, 503 + Retry-After, 504 and 500 (`errors`).

Where each callee is: in a pod, the operator passes its Service URL (or the router's) in
`BATCHD_CALLS`; locally, `batchd serve --call embedder=http://127.0.0.1:8001` points an alias at
another local replica. Through a router, the model name in the path picks the callee deployment:
the handle reads the callee's model name from `GET /v1/models`, which a router does not answer
(it serves many models), so there the name is the callee deployment's, the default model name.

A call is sent again at most once, and only when nothing of it can have been computed: the
connection could not be opened or was closed before any answer (a keep-alive connection closed
as the call went out), or the callee refused it before accepting it (`batchd-refused`: full
queue, draining, loading; a new connection may reach another replica). A router keeps that mark
to itself once it has retried, so a call through a router is never sent twice on its account.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from batchd.api.headers import CALLED_BY_HEADER, FAIRNESS_HEADER, PRIORITY_HEADER, REFUSED_HEADER
from batchd.replica.batch_deadline import batch_class, seconds_left
from batchd.replica.errors import CalleeError, CalleeOverloaded, CalleeTimeout, CalleeUnavailable
from batchd.replica.json_encoding import plain
from batchd.replica.queueing import caller_in
from batchd.replica.traces import current_batch

__all__ = [
    "CallClient",
    "CalleeError",
    "CalleeOverloaded",
    "CalleeTimeout",
    "CalleeUnavailable",
    "DeploymentHandle",
    "make_handles",
]

logger = logging.getLogger(__name__)

# A call made outside any batch (a handler's warmup, a script): as long as a request may wait
# by default (`request_timeout_s`).
DEFAULT_TIMEOUT_S = 30.0
# Connections one replica keeps open to all its callees together; calls beyond wait for one
# (within their deadline). Enough for max_concurrent_batches batches of a few dozen calls each.
MAX_CONNECTIONS = 256
_JSON = {"Content-Type": "application/json"}
_PRIORITY, _FAIRNESS, _CALLED_BY = (
    PRIORITY_HEADER.decode(),
    FAIRNESS_HEADER.decode(),
    CALLED_BY_HEADER.decode(),
)
_REFUSED = REFUSED_HEADER.decode()
# Failures before any answer came: nothing was sent, or a keep-alive connection was closed by the
# callee as the call went out (nothing read it). Anything later may have been computed.
_NOTHING_ANSWERED = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError)


class CallClient:
    """The replica's pooled HTTP client for its handles: one aiohttp session per event loop
    that calls (the handler's own loop, in practice), keep-alive connections shared by all."""

    def __init__(self, max_connections: int = MAX_CONNECTIONS) -> None:
        self._max_connections = max_connections
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._lock = threading.Lock()
        self._closing: set[asyncio.Task[None]] = set()

    def session(self) -> aiohttp.ClientSession:
        """The running loop's session (an aiohttp session belongs to the loop it was made on)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            session = self._sessions.get(loop)
            if session is None or session.closed:
                session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=self._max_connections),
                    # No timeout of aiohttp's own: every call is bounded by its batch's deadline.
                    timeout=aiohttp.ClientTimeout(total=None),
                    skip_auto_headers=("User-Agent",),
                )
                self._sessions[loop] = session
            return session

    def close(self, timeout_s: float = 5.0) -> None:
        """Close every session, each on its own loop; callable from any thread (model shutdown)."""
        with self._lock:
            sessions, self._sessions = self._sessions, {}
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, session in sessions.items():
            if session.closed or loop.is_closed() or not loop.is_running():
                continue
            if loop is current:  # closing waits on this very loop: leave it to a task
                task = loop.create_task(session.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
                continue
            closing = asyncio.run_coroutine_threadsafe(session.close(), loop)
            try:
                closing.result(timeout_s)
            except Exception:  # shutting down: a session that will not close is not worth a hang
                logger.warning("a session of the handles' HTTP client did not close", exc_info=True)

    async def aclose(self) -> None:
        """Close every session; sessions of the running loop are awaited here."""
        loop = asyncio.get_running_loop()
        with self._lock:
            own = self._sessions.pop(loop, None)
        if own is not None:
            await own.close()
        await asyncio.to_thread(self.close)


@dataclass(frozen=True, slots=True)
class _Route:
    """How a call goes over one of the callee's routes: the path and body for the model's name
    and the items, and the results read from the answer."""

    request: Callable[[str, list[Any]], tuple[str, bytes]]
    results: Callable[[Any], Any]
    results_are: str  # for the error when the answer holds the wrong number


def _predict_request(name: str, items: list[Any]) -> tuple[str, bytes]:
    body = orjson.dumps({"instances": plain(items)}, option=orjson.OPT_SERIALIZE_NUMPY)
    return f"/v1/models/{name}:predict", body


def _embeddings_request(name: str, texts: list[Any]) -> tuple[str, bytes]:
    return "/v1/embeddings", orjson.dumps({"model": name, "input": texts, "encoding_format": "float"})


_PREDICT = _Route(_predict_request, lambda answer: answer["predictions"], "prediction(s)")
_EMBEDDINGS = _Route(
    _embeddings_request, lambda answer: [entry["embedding"] for entry in answer["data"]], "embedding(s)"
)


class DeploymentHandle:
    """Calls one other BatchedDeployment (`model.calls`); what the handler's constructor receives.

    `await handle.remote(item)` is the callee's answer for one item; `await
    handle.remote_many(items)` the answers for several, in order; `await handle.embed(texts)` an
    embedding model's vectors, through its OpenAI route. Raises `CalleeOverloaded`,
    `CalleeUnavailable`, `CalleeTimeout` or `CalleeError`, each naming the callee.
    """

    def __init__(
        self,
        alias: str,
        deployment: str,
        url: str,
        client: CallClient,
        *,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        composer: str = "",
    ) -> None:
        self.alias = alias
        self.deployment = deployment
        self.url = url.rstrip("/")
        self._client = client
        self._default_timeout_s = default_timeout_s
        self._composer = composer or alias  # who calls, as `batchd-called-by` says
        self._model_name: str | None = None  # the callee's model name, read from it on first use
        self._discovery = asyncio.Lock()  # calls that start together read it once

    def __repr__(self) -> str:
        return f"DeploymentHandle({self.alias!r} -> BatchedDeployment {self.deployment!r} at {self.url})"

    async def remote(self, item: Any) -> Any:
        """The callee's answer for one item, batched at the callee with everybody else's."""
        (result,) = await self._call([item])
        return result

    async def remote_many(self, items: Sequence[Any]) -> list[Any]:
        """The callee's answers for `items`, in order, sent as one request (one KServe V1
        `instances` list: if the callee fails one item, the whole call fails)."""
        if not items:
            return []
        return await self._call(list(items))

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """An embedding model's vectors for `texts`, in order, through its OpenAI route
        (`POST /v1/embeddings`), batched at the callee with everybody else's."""
        if not texts:
            return []
        return await self._call(list(texts), _EMBEDDINGS)

    # -- one call ----------------------------------------------------------------------------

    async def _call(self, items: list[Any], route: _Route = _PREDICT) -> list[Any]:
        left = seconds_left(self._default_timeout_s)
        if left <= 0:
            raise self._error(CalleeTimeout, "not called: the requests it was for are past their deadline")
        batch = current_batch()  # the traced batch this call is made for, if any
        if batch is None:
            return await self._within(left, items, route, self._headers())
        call = batch.call_started(self.alias, self.deployment, self.url)
        answered: list[int] = []
        try:
            results = await self._within(left, items, route, {**self._headers(), **call.headers}, answered)
        except BaseException as error:
            call.finished(answered[-1] if answered else None, error)
            raise
        call.finished(200, None)
        return results

    async def _within(
        self,
        left: float,
        items: list[Any],
        route: _Route,
        headers: Mapping[str, str],
        answered: list[int] | None = None,
    ) -> list[Any]:
        try:
            async with asyncio.timeout(left):
                return await self._send(items, route, headers, answered)
        except TimeoutError:
            raise self._error(
                CalleeTimeout, f"no answer within the {left:.3g} s left to the requests it was called for"
            ) from None

    async def _send(
        self, items: list[Any], route: _Route, headers: Mapping[str, str], answered: list[int] | None
    ) -> list[Any]:
        """`answered`: where each answer's status is noted (for the call's span)."""
        session = self._client.session()
        for attempt in (1, 2):
            final = attempt == 2
            try:
                name = self._model_name or await self._discover_once(session)
                path, body = route.request(name, items)
                async with session.post(f"{self.url}{path}", data=body, headers=headers) as response:
                    status, payload = response.status, await response.read()
                    if answered is not None:
                        answered.append(status)
                    refused = _REFUSED in response.headers
                    retry_after = response.headers.get("Retry-After")
            except aiohttp.ClientError as error:
                # Once more, on a new connection the Service may route elsewhere, if nothing of
                # the call can have reached the model.
                if final or not isinstance(error, _NOTHING_ANSWERED):
                    raise self._error(
                        CalleeUnavailable, f"unreachable at {self.url}: {_reason(error)}"
                    ) from None
                continue
            if status == 200:
                return self._results(route, payload, len(items))
            if not final and status == 503 and refused:
                continue  # refused before accepting (a full or draining replica): another may take it
            if not final and status == 404:
                self._model_name = None  # the callee's model was renamed: read its name again
                continue
            raise self._failure(status, payload, retry_after)
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _headers(self) -> dict[str, str]:
        """A call's headers: JSON, and the class and caller of the batch it is made for (a traced
        call adds its span's context)."""
        headers = {**_JSON, _CALLED_BY: self._composer}
        asked = batch_class()
        if asked is not None:
            priority_class, caller = asked
            headers[_PRIORITY] = priority_class
            if caller_in(caller):
                headers[_FAIRNESS] = caller_in(caller)
        return headers

    async def _discover_once(self, session: aiohttp.ClientSession) -> str:
        async with self._discovery:
            return self._model_name or await self._discover(session)

    async def _discover(self, session: aiohttp.ClientSession) -> str:
        """The callee's model name (`GET /v1/models`), which its inference URLs carry."""
        async with session.get(f"{self.url}/v1/models") as response:
            payload = await response.read()
            if response.status == 404:  # a router: the deployment's name is its default model name
                self._model_name = self.deployment
                return self.deployment
            if response.status != 200:
                raise self._failure(response.status, payload, response.headers.get("Retry-After"))
        try:
            models = orjson.loads(payload)["models"]
            name = str(models[0])
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            raise self._error(
                CalleeError, f"GET /v1/models answered {payload[:200]!r}, not a model list"
            ) from None
        self._model_name = name
        return name

    def _results(self, route: _Route, payload: bytes, expected: int) -> list[Any]:
        try:
            results = route.results(orjson.loads(payload))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            results = None
        if not isinstance(results, list) or len(results) != expected:
            raise self._error(
                CalleeError,
                f"answered 200 without {expected} {route.results_are}: {payload[:200]!r}",
                status=200,
            )
        return results

    def _failure(self, status: int, payload: bytes, retry_after: str | None) -> CalleeError:
        what = f"answered {status}: {_message(payload)}"
        if status == 503:
            return CalleeOverloaded(
                self._described(what),
                alias=self.alias,
                deployment=self.deployment,
                retry_after_s=_seconds(retry_after),
            )
        if status == 504:
            return self._error(CalleeTimeout, what, status=status)
        return self._error(CalleeError, what, status=status)

    def _error(self, kind: type[CalleeError], what: str, status: int | None = None) -> CalleeError:
        return kind(self._described(what), alias=self.alias, deployment=self.deployment, status=status)

    def _described(self, what: str) -> str:
        return f"callee {self.alias!r} (BatchedDeployment {self.deployment!r}) {what}"


def make_handles(
    calls: Mapping[str, str],
    addresses: Mapping[str, str],
    client: CallClient,
    *,
    default_timeout_s: float = DEFAULT_TIMEOUT_S,
    composer: str = "",
) -> dict[str, DeploymentHandle]:
    """One handle per alias of `model.calls` (alias -> deployment), at `addresses` (alias -> URL).

    Raises ValueError naming the alias when one has no address, or an address names no alias.
    """
    missing = [alias for alias in calls if alias not in addresses]
    if missing:
        alias = missing[0]
        raise ValueError(
            f"model.calls.{alias}: no address for BatchedDeployment {calls[alias]!r}: run "
            f"`batchd serve --call {alias}=http://HOST:PORT`, or set BATCHD_CALLS "
            f'(\'{{"{alias}": "http://HOST:PORT"}}\'; the operator sets it in a pod)'
        )
    unknown = sorted(set(addresses) - set(calls))
    if unknown:
        raise ValueError(
            f"--call/BATCHD_CALLS: {unknown[0]!r} is not an alias of model.calls "
            f"(it has: {', '.join(map(repr, calls)) or 'none'})"
        )
    return {
        alias: DeploymentHandle(
            alias,
            deployment,
            addresses[alias],
            client,
            default_timeout_s=default_timeout_s,
            composer=composer,
        )
        for alias, deployment in calls.items()
    }


def _message(payload: bytes) -> str:
    """The callee's own error message (batchd answers `{"error": ...}`, and on its OpenAI routes
    `{"error": {"message": ...}}`), else the body's start."""
    with contextlib.suppress(orjson.JSONDecodeError, TypeError, KeyError):
        error = orjson.loads(payload)["error"]
        return str(error["message"] if isinstance(error, dict) and "message" in error else error)
    return payload[:200].decode("utf-8", "replace") or "(no body)"


def _seconds(retry_after: str | None) -> float:
    try:
        return max(1.0, float(retry_after)) if retry_after else 1.0
    except ValueError:  # an HTTP date: not what batchd sends
        return 1.0


def _reason(error: aiohttp.ClientError) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
