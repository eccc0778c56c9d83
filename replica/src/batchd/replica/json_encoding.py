"""Model outputs made plain: numpy and torch values become Python numbers and lists for JSON."""

from __future__ import annotations

import json
from typing import Any

import orjson


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


def json_bytes(value: Any) -> bytes:
    """A result as JSON: orjson (numpy values too) for speed, the standard library for what orjson
    refuses but JSON allows (integers past 64 bits); TypeError naming the type when it is no JSON."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as error:
        try:
            return json.dumps(plain(value), separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError):
            raise TypeError(f"the model's result is not JSON: {error}") from None
