"""What the batcher and the routes need from a model, whatever kind of model it is.

A model takes a list of items and returns one result per item, in order (`BatchModel`); a
text-generation model also serves the generate routes (`TextGenerator`). How it gets there (a
transformers pipeline, a user's handler class, the generation engine) is the business of the
modules beside this one and of `batchd.replica.generation`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import TypeAdapter

from batchd.api.spec import BatchingSpec, TensorSpec

if TYPE_CHECKING:  # the generation package imports torch, which only text-generation models need
    from batchd.replica.batching import Batcher, ClassObserver
    from batchd.replica.generation.engine import StepObserver
    from batchd.replica.generation.service import GenerationService
    from batchd.replica.generation.streams import SequenceObserver
    from batchd.replica.traces import DecodingTracer


@dataclass(frozen=True)
class ModelMetadata:
    """What `GET /v2/models/{name}` reports."""

    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


class BatchModel(Protocol):
    """A loaded, ready-to-call model. Implementations run their work off the event loop."""

    @property
    def item_adapter(self) -> TypeAdapter[Any]:
        """Validates and coerces one input item before it is queued (lax mode: "3" -> 3 for int)."""
        ...

    @property
    def metadata(self) -> ModelMetadata: ...

    async def predict_batch(self, items: list[Any]) -> list[Any]:
        """One result per item, in order, JSON-serialisable. Never blocks the calling event loop."""
        ...

    async def warmup(self, max_batch_size: int) -> None:
        """Exercise the model once (or more) so that the first user request pays no start-up cost."""
        ...

    def close(self) -> None:
        """Release threads and memory; called once at shutdown."""
        ...


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


class ModelLoadError(RuntimeError):
    """The model named by the spec cannot be loaded; the message says which field and why."""
