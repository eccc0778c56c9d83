"""The model layer: everything the batcher may call, behind the `BatchModel` protocol."""

from __future__ import annotations

from batchd.replica.models.base import BatchModel, ModelLoadError

__all__ = ["BatchModel", "ModelLoadError"]
