"""What a text-generation model is to the replica: a `BatchModel` that also brings the service
that schedules its generation requests (`TextGenerator`), and what the replica gives that
service (`GenerationSetup`). Here, above the models, so that the models never import generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from batchd.api.spec import BatchingSpec
from batchd.replica.models.base import BatchModel

if TYPE_CHECKING:  # the engine imports torch, which only text-generation models need
    from batchd.replica.batching import Batcher, ClassObserver
    from batchd.replica.generation.engine import StepObserver
    from batchd.replica.generation.service import GenerationService
    from batchd.replica.generation.streams import SequenceObserver
    from batchd.replica.traces import DecodingTracer


@dataclass(frozen=True)
class GenerationSetup:
    """What the replica gives a text-generation model's service: its batching, its batcher (for
    request-level scheduling), where it reports each sequence, each engine step, and what each
    priority class was served and refused, and the memory its pod asks for
    (resources.requests.memory, in bytes; None when it names none)."""

    config: BatchingSpec
    batcher: Batcher
    sequences: SequenceObserver
    steps: StepObserver
    classes: ClassObserver
    memory_request_bytes: int | None = None
    tracer: DecodingTracer | None = None  # the decoding runs' spans; None untraced


@runtime_checkable
class TextGenerator(BatchModel, Protocol):
    """A model that generates text for the generate routes, besides answering batches: what a
    model can do is this type, checked once when the replica loads it."""

    def generation_service(self, setup: GenerationSetup) -> GenerationService:
        """The service that schedules its generation requests (by token or by request), started
        once the replica is ready to serve; called once."""
        ...
