"""Choosing where a model runs and in which precision, from `model.device` and `model.dtype`."""

from __future__ import annotations

from batchd.replica.models.base import ModelLoadError


def choose_device(requested: str, cuda_available: bool) -> str:
    """`auto` is cuda when a GPU is visible, else cpu; an explicit cuda without a GPU is an error."""
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested == "cuda" and not cuda_available:
        raise ModelLoadError("model.device: 'cuda' was asked for, but torch sees no GPU in this container")
    return requested


def choose_dtype(requested: str, device: str) -> str:
    """`auto` is float16 on a GPU (half the memory, tensor cores) and float32 on a CPU."""
    if requested == "auto":
        return "float16" if device == "cuda" else "float32"
    return requested
