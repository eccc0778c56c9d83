"""Model outputs made plain: numpy and torch values become Python numbers and lists for JSON."""

from __future__ import annotations

from typing import Any


def plain(value: Any) -> Any:
    """numpy arrays and scalars, torch tensors, and containers of them, as plain Python."""
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    tolist = getattr(value, "tolist", None)
    if callable(tolist):  # numpy arrays and scalars, torch tensors
        if hasattr(value, "detach"):
            value = value.detach().cpu()
        return value.tolist()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value
