"""What the batcher and the routes need from a model, whatever kind of model it is.

A model takes a list of items and returns one result per item, in order (`BatchModel`). How it
gets there (a transformers pipeline, a user's handler class) is the business of the modules
beside this one; a text-generation model is a `BatchModel` that also serves the generate routes
(`batchd.replica.generation.generator`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import TypeAdapter

from batchd.api.spec import TensorSpec


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


class ModelLoadError(RuntimeError):
    """The model named by the spec cannot be loaded; the message says which field and why."""
