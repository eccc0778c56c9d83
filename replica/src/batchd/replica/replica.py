"""`Replica`: one replica's serving state: the model, its batcher, its metrics, and admission of work.

The protocol modules decode requests into items and encode results; what they have in common
(readiness, validation of items, admission into the batcher) is here, so that the three
protocols behave the same way. A model that is a `TextGenerator` also brings a generation service
(`batchd.replica.generation`): with token-level scheduling, the inference routes' prompts go to
it rather than to the batcher, and the generate routes use it either way.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from batchd.api.quantity import memory_request_bytes
from batchd.api.spec import BatchedDeployment, TensorSpec
from batchd.replica.batching import Batcher
from batchd.replica.errors import Draining, InvalidInput, NotReady, Stalled, TooLarge, UnknownModel
from batchd.replica.generation.generator import GenerationSetup, TextGenerator
from batchd.replica.metrics import GenerationMetrics, ReplicaMetrics
from batchd.replica.models.base import BatchModel
from batchd.replica.settings import ReplicaSettings
from batchd.replica.traces import Tracing
from batchd.replica.waiting import NO_CLIENT, Client, Running, Submission, outcome

if TYPE_CHECKING:  # the generation package imports torch, which only text-generation replicas need
    from batchd.replica.generation.service import GenerationService

logger = logging.getLogger(__name__)

# A batch running this many times request_timeout_s makes the replica report not live.
HUNG_FACTOR = 3


class Replica:
    """Loads the model, owns the batcher, and answers inference requests through it."""

    def __init__(
        self, manifest: BatchedDeployment, settings: ReplicaSettings, tracing: Tracing | None = None
    ) -> None:
        self.manifest = manifest
        self.settings = settings
        self.model_name = manifest.model_name
        self.tracing = tracing  # None: untraced (no OpenTelemetry code is loaded)
        self.metrics = ReplicaMetrics(deployment=manifest.metadata.name, model=self.model_name)
        self.batcher = Batcher(manifest.spec.batching, observer=self.metrics, tracer=tracing)
        self.model: BatchModel | None = None  # set once loaded and warmed
        self.inflight = 0  # requests accepted and not yet answered; kept by the inference routes
        self.load_error: Exception | None = None
        self.hung = False  # a batch outlived the drain at shutdown
        self.generation: GenerationService | None = None  # text-generation models only
        # The same service when it schedules tokens (decided once, at load): its prompts bypass
        # the batcher, and its sequences count as items in the load.
        self._token_level: GenerationService | None = None
        self.metrics.track(
            queue_depth=lambda: self.batcher.queue_depth + self._sequences()[0],
            running_items=lambda: self.batcher.running_items + self._sequences()[1],
            inflight=lambda: self.inflight,
        )
        self.metrics.classes.track(self._class_depths)
        self.metrics.track_adaptive(
            cost=lambda: self.batcher.cost.fitted,
            arrival_rate=lambda: self.batcher.arrivals.at(asyncio.get_running_loop().time()),
        )
        self.metrics.batching_revision.set(manifest.batching_revision)

    def retune(self, manifest: BatchedDeployment) -> None:
        """Batch by `manifest.spec.batching` from the next batch on (see `retuning`)."""
        self.manifest = manifest
        self.batcher.reconfigure(manifest.spec.batching)
        if self.generation is not None:
            self.generation.reconfigure(manifest.spec.batching)
        self.metrics.batching_revision.set(manifest.batching_revision)

    def _class_depths(self) -> list[tuple[str, int]]:
        """Items and sequences waiting alive, by priority class."""
        depths = dict(self.batcher.class_depths())
        if self._token_level is not None:
            for name, waiting in self._token_level.class_depths():
                depths[name] = depths.get(name, 0) + waiting
        return list(depths.items())

    def _sequences(self) -> tuple[int, int]:
        """Sequences waiting and running in token-level scheduling: items, as the autoscaler counts
        them (request-level generation requests are the batcher's items already)."""
        token_level = self._token_level
        if token_level is None:
            return 0, 0
        return token_level.waiting, token_level.running

    def load(self) -> dict[str, Any]:
        """What the operator reads to autoscale and to follow live retuning (`GET /load`)."""
        waiting, running = self._sequences()
        return {
            "ready": self.ready,
            "queued_items": self.batcher.queue_depth + waiting,
            "running_items": self.batcher.running_items + running,
            "sheddable_items": self.batcher.sheddable_items
            + (self._token_level.sheddable if self._token_level is not None else 0),
            "inflight_requests": self.inflight,
            "batching_revision": self.manifest.batching_revision,
        }

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
        model = await asyncio.to_thread(load)
        await model.warmup(self.manifest.spec.batching.max_batch_size)
        self._serve_generation(model)
        # Everything loaded so far (the model, torch, the server) lives as long as the process:
        # out of the collector's sight, a full collection walks only what requests allocate
        # (it walked the whole heap: a sixth of the server's CPU on a trivial model).
        gc.freeze()
        self.model = model
        self.batcher.start(model.predict_batch)  # unless a SIGTERM came during loading
        self.metrics.model_ready.set(1 if self.ready else 0)
        logger.info("model %r ready in %.1f s", self.model_name, time.perf_counter() - started)

    def _serve_generation(self, model: BatchModel) -> None:
        """A text-generation model's service (token- or request-level), with its metrics."""
        if not isinstance(model, TextGenerator):
            return
        metrics = GenerationMetrics(self.metrics.registry, self.manifest.metadata.name, self.model_name)
        setup = GenerationSetup(
            self.manifest.spec.batching,
            self.batcher,
            sequences=metrics,
            steps=metrics,
            classes=self.metrics,
            memory_request_bytes=memory_request_bytes(self.manifest.spec.resources),
            tracer=self.tracing,
        )
        service = model.generation_service(setup)
        metrics.track(
            running=lambda: service.running,
            waiting=lambda: service.waiting,
            kv_usage=lambda: service.kv_usage,
        )
        metrics.prefix_cache.track(lambda: service.prefix_cache)
        self.generation = service
        self._token_level = service if service.scheduling == "token" else None

    def begin_draining(self) -> None:
        """Turn unready at once (SIGTERM); accepted work still completes."""
        self.batcher.begin_draining()
        if self.generation is not None:
            self.generation.begin_draining()
        self.metrics.model_ready.set(0)

    async def stop(self) -> None:
        """Finish what was accepted (within `drain_timeout_s`), then release the model.

        A handler stuck in a batch would hold the drain, and the process, forever: past the
        drain timeout the replica stops waiting for it (`hung` says so, and the CLI exits 1).
        """
        self.begin_draining()
        drains = [self.batcher.drain()] + ([self.generation.drain()] if self.generation is not None else [])
        try:
            await asyncio.wait_for(asyncio.gather(*drains), self.settings.drain_timeout_s)
        except TimeoutError:
            logger.error("a batch is still in the model after drain_timeout_s; not waiting for it")
            self.hung = True
            return
        if self.model is not None:
            self.model.close()

    @property
    def ready(self) -> bool:
        """Loaded, warmed, not shutting down and not stuck: what /v2/health/ready answers."""
        return self.model is not None and not self.batcher.draining and not self.stalled

    @property
    def stalled(self) -> bool:
        """A batch has run longer than `request_timeout_s`: every request in it has had its 504,
        and new ones would only wait; the replica turns unready until the batch comes back."""
        return self.longest_running_s > self.batcher.config.request_timeout_s

    @property
    def live(self) -> bool:
        """False once a batch has run HUNG_FACTOR times `request_timeout_s`: a handler stuck that
        long will not come back, and only a restart (the kubelet's, on the liveness probe) frees it."""
        return self.longest_running_s <= HUNG_FACTOR * self.batcher.config.request_timeout_s

    @property
    def longest_running_s(self) -> float:
        """How long the model has been on its current batch (or generation step)."""
        step = self.generation.longest_step_s if self.generation is not None else 0.0
        return max(self.batcher.longest_running_s, step)

    @property
    def output_specs(self) -> tuple[TensorSpec, ...]:
        """The outputs the model declares: names and datatypes of V2 answers."""
        return self.model.metadata.outputs if self.model else ()

    # -- the request path ------------------------------------------------------------------

    def check_name(self, name: str) -> None:
        if name != self.model_name:
            raise UnknownModel(f"model {name!r} is not served here; this replica serves {self.model_name!r}")

    async def infer(self, items: Sequence[Any], field: str, client: Client = NO_CLIENT) -> list[Any]:
        """`submit`, then wait for the results, in order."""
        return await outcome(self.submit(items, field, client))

    def submit(self, items: Sequence[Any], field: str, client: Client = NO_CLIENT) -> Submission:
        """The way into the core for a request's batch items: each validated, then queued for
        the batcher, or, with token-level scheduling, each prompt a sequence of its own. Returns
        at once; the caller awaits the submission (`outcome`) or adds a callback to its waiter."""
        valid = self._admissible(items, field)
        generation = self._token_level
        if generation is None:
            return self.batcher.submit(valid, client)
        # The answer is the pipeline's: prompt and continuation.
        prepare = generation.preparer.prepare
        requests = [prepare(text, None, f"{field}[{i}]") for i, text in enumerate(valid)]

        async def continued() -> list[Any]:
            completions = await generation.complete(requests, client)
            return [r.prompt + c.text for r, c in zip(requests, completions, strict=True)]

        return Running(asyncio.ensure_future(continued()))

    def _admissible(self, items: Sequence[Any], field: str) -> list[Any]:
        """The items validated, once the replica can take them; else the error that says why not."""
        model = self._serving("batch")
        if not items:
            raise InvalidInput(f"{field}: the batch is empty")
        limit = self.batcher.config.max_queued_requests
        if len(items) > limit:
            raise TooLarge(f"{field}: {len(items)} items, more than max_queued_requests={limit} ever fit")
        validate = model.item_adapter.validate_python
        valid = []
        for position, item in enumerate(items):
            try:
                valid.append(validate(item))
            except ValidationError as error:
                problem = error.errors(include_url=False)[0]
                raise InvalidInput(f"{field}[{position}]: {problem['msg']} (got {item!r})") from None
        return valid

    def generator(self, name: str) -> GenerationService:
        """The generation service for the generate routes, once the model is ready to serve."""
        self.check_name(name)
        self._serving("step")
        if self.generation is None:
            raise UnknownModel(
                f"model {name!r} does not generate text: the generate extension serves task text-generation"
            )
        return self.generation

    def _serving(self, work: str) -> BatchModel:
        """The model, when it takes work: else why not (loading, draining, stuck on a `work`)."""
        if self.model is None:
            if self.batcher.draining:
                raise Draining()
            raise NotReady.loading(self.model_name)
        if self.stalled:
            raise Stalled.on(work, self.longest_running_s)
        return self.model
