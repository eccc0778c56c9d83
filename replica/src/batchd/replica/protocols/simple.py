"""The seeds' simple call: `curl "http://localhost:8000/?text=Once+upon+a+time"` answers one result.

The query's single parameter is the item (several parameters make a dict item); GET and POST
both work, as in Ray Serve's tutorial, which POSTs with `params=`. The route itself is answered
by `batchd.replica.inference`.
"""

from __future__ import annotations

from typing import Any

from batchd.replica.errors import InvalidInput


def item_from_query(params: list[tuple[str, str]]) -> Any:
    if not params:
        raise InvalidInput("query: expected a parameter, as in /?text=Once+upon+a+time")
    if len(params) == 1:
        return params[0][1]
    return dict(params)
