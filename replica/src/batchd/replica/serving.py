"""One replica's serving state: the model, its batcher, its metrics, and admission of work.

The protocol modules decode requests into items and encode results; what they have in common
(readiness, validation of items, admission into the batcher) is here, so that the three
protocols behave the same way.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from batchd.api.spec import BatchedDeployment
from batchd.replica.batching import Batcher, Draining
from batchd.replica.errors import (
    InvalidInput,
    NotReady,
    TooLarge,
    UnknownModel,
)
from batchd.replica.metrics import ReplicaMetrics
from batchd.replica.models.base import BatchModel, TensorSpec
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
        self.inflight = 0  # requests accepted and not yet answered; kept by the inference routes
        self.load_error: Exception | None = None
        self.metrics.track(
            queue_depth=lambda: self.batcher.queue_depth if self.batcher else 0,
            inflight=lambda: self.inflight,
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, load: Callable[[], BatchModel]) -> None:
        """Load (off the event loop, so health checks answer meanwhile), warm up, then turn ready.

        A failure is kept in `load_error` (the server exits on it) rather than raised: this runs
        as a background task while the server already answers /v2/health/live.
        """
        try:
            await self._load(load)
        except Exception as error:
            logger.exception("model %r failed to load", self.model_name)
            self.load_error = error

    async def _load(self, load: Callable[[], BatchModel]) -> None:
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

    @property
    def output_specs(self) -> tuple[TensorSpec, ...]:
        """The outputs the model declares: names and datatypes of V2 answers."""
        return self.model.metadata.outputs if self.model else ()

    # -- the request path ------------------------------------------------------------------

    def check_name(self, name: str) -> None:
        if name != self.model_name:
            raise UnknownModel(f"model {name!r} is not served here; this replica serves {self.model_name!r}")

    def submit(self, items: Sequence[Any], field: str) -> list[asyncio.Future[Any]]:
        """Validate each item and queue them all with everybody else's; one future per item, in order."""
        if self.state is State.DRAINING:
            raise Draining("the replica is shutting down; retry on another replica")
        if self.model is None or self.batcher is None:
            raise NotReady(f"model {self.model_name!r} is still loading")
        if not items:
            raise InvalidInput(f"{field}: the batch is empty")
        limit = self.manifest.spec.batching.max_queued_requests
        if len(items) > limit:
            raise TooLarge(f"{field}: {len(items)} items, more than max_queued_requests={limit} ever fit")
        validate = self.model.item_adapter.validate_python
        valid = []
        for position, item in enumerate(items):
            try:
                valid.append(validate(item))
            except ValidationError as error:
                problem = error.errors(include_url=False)[0]
                raise InvalidInput(f"{field}[{position}]: {problem['msg']} (got {item!r})") from None
        return self.batcher.submit(valid)
