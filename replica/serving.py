"""One replica's serving state: the model, its batcher, its metrics, and the request path they share.

The protocol modules decode requests into items and encode results; everything they have in
common (readiness, validation of items, admission, outcome metrics, the error answer) is here,
so that the three protocols behave the same way.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from batchd.api.spec import BatchedDeployment
from batchd.replica.batching import Batcher, QueueFull
from batchd.replica.errors import (
    ClientDisconnected,
    InvalidInput,
    NotReady,
    TooLarge,
    UnknownModel,
    answer_for,
    describe,
)
from batchd.replica.metrics import ReplicaMetrics
from batchd.replica.models.base import BatchModel
from batchd.replica.settings import ReplicaSettings

logger = logging.getLogger(__name__)


class State(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"


class Replica:
    """Loads the model, owns the batcher, and answers inference requests through it."""

    def __init__(self, manifest: BatchedDeployment, settings: ReplicaSettings) -> None:
        self.manifest = manifest
        self.settings = settings
        self.model_name = manifest.model_name
        self.metrics = ReplicaMetrics(deployment=manifest.metadata.name, model=self.model_name)
        self.state = State.LOADING
        self.model: BatchModel | None = None
        self.batcher: Batcher | None = None
        self._inflight = 0
        self.metrics.track(
            queue_depth=lambda: self.batcher.queue_depth if self.batcher else 0,
            inflight=lambda: self._inflight,
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, load: Callable[[], BatchModel]) -> None:
        """Load (off the event loop, so health checks answer meanwhile), warm up, then turn ready."""
        started = time.perf_counter()
        model = self.model = await asyncio.to_thread(load)
        await model.warmup(self.manifest.spec.batching.max_batch_size)
        self.batcher = Batcher(model.predict_batch, self.manifest.spec.batching, observer=self.metrics)
        self.batcher.start()
        if self.state is State.LOADING:  # a SIGTERM during loading wins
            self.state = State.READY
            self.metrics.model_ready.set(1)
        logger.info("model %r ready in %.1f s", self.model_name, time.perf_counter() - started)

    def begin_draining(self) -> None:
        """Turn unready at once (SIGTERM); accepted work still completes."""
        self.state = State.DRAINING
        self.metrics.model_ready.set(0)

    async def stop(self) -> None:
        self.begin_draining()
        if self.batcher is not None:
            await self.batcher.drain()
        if self.model is not None:
            self.model.close()

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    # -- the request path ------------------------------------------------------------------

    def check_name(self, name: str) -> None:
        if name != self.model_name:
            raise UnknownModel(f"model {name!r} is not served here; this replica serves {self.model_name!r}")

    async def infer(self, request: Request, name: str, items: Sequence[Any], field: str) -> list[Any]:
        """Validate each item, batch them with everybody else's, and return their results in order.

        Call it once the request body has been read: from then on a client that disconnects
        cancels its items.
        """
        self.check_name(name)
        if self.state is State.LOADING or self.model is None or self.batcher is None:
            raise NotReady(f"model {self.model_name!r} is still loading")
        if not items:
            raise InvalidInput(f"{field}: the batch is empty")
        limit = self.manifest.spec.batching.max_queued_requests
        if len(items) > limit:
            raise TooLarge(f"{field}: {len(items)} items, more than max_queued_requests={limit} ever fit")
        adapter = self.model.item_adapter
        valid = []
        for position, item in enumerate(items):
            try:
                valid.append(adapter.validate_python(item))
            except ValidationError as error:
                problem = error.errors(include_url=False)[0]
                raise InvalidInput(f"{field}[{position}]: {problem['msg']} (got {item!r})") from None
        async with _cancelled_on_disconnect(request.receive):
            return await self.batcher.call(valid)

    async def read_json(self, request: Request) -> Any:
        """The request body as JSON, refusing bodies over max_body_bytes before reading them whole."""
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise TooLarge(f"request body: {declared} bytes, more than the {limit} this replica accepts")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"request body: more than the {limit} bytes this replica accepts")
            chunks.append(chunk)
        body = b"".join(chunks)
        if not body:
            raise InvalidInput("request body: empty; expected JSON")
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise InvalidInput(f"request body: not valid JSON: {error}") from None

    async def respond(self, work: Callable[[], Awaitable[Any]]) -> Response:
        """Run one request's work; answer JSON, or the error the table says, and count the outcome."""
        started = time.perf_counter()
        self._inflight += 1
        try:
            payload = await work()
        except Exception as error:
            return self._error_response(error, started)
        finally:
            self._inflight -= 1
        self.metrics.request_done("success", time.perf_counter() - started)
        return Response(
            orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
        )

    def _error_response(self, error: Exception, started: float) -> Response:
        answer = answer_for(error)
        self.metrics.request_done(answer.outcome, time.perf_counter() - started)
        if answer.rejection:
            self.metrics.rejected(answer.rejection)
        if answer.status >= 500 and answer.outcome == "error":
            logger.error("request failed: %s", describe(error))
        headers = {}
        if answer.retry:
            retry_after = error.retry_after_s if isinstance(error, QueueFull) else 1.0
            headers["Retry-After"] = str(max(1, round(retry_after)))
        body = orjson.dumps({"error": describe(error)})
        return Response(body, status_code=answer.status, headers=headers, media_type="application/json")


@asynccontextmanager
async def _cancelled_on_disconnect(receive: Receive) -> AsyncIterator[None]:
    """Cancel the request's work when its client disconnects, so its items never reach the model."""
    task = asyncio.current_task()
    assert task is not None
    disconnected = False

    async def watch() -> None:
        nonlocal disconnected
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnected = True
        task.cancel()

    watcher = asyncio.create_task(watch())
    try:
        yield
    except asyncio.CancelledError:
        if disconnected and task.uncancel() == 0:
            raise ClientDisconnected("the client went away before its answer was ready") from None
        raise
    finally:
        watcher.cancel()
