"""The simple call: `curl "http://localhost:8000/?text=Once+upon+a+time"` answers one result.

The query's single parameter is the item (several parameters make a dict item); GET and POST
both work, as in Ray Serve's tutorial, which POSTs with `params=`. Both are endpoints of batch
items (`Items`).
"""

from __future__ import annotations

from typing import Any

from batchd.api.routes import SIMPLE_CALL_GET, SIMPLE_CALL_POST
from batchd.replica.errors import InvalidInput
from batchd.replica.front.endpoints import Call, Endpoint, Items

TAG = "Simple call"
# Any query parameters: the one there is becomes the item, several make a dict item.
_QUERY = {
    "name": "item",
    "in": "query",
    "required": True,
    "style": "form",
    "explode": True,
    "description": "One parameter is the item (`?text=Once+upon+a+time`); several make a dict item.",
    "schema": {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 1},
}
SUMMARY = "One item in the query string, one result back (`/?text=...`)"


def query_item(call: Call) -> list[Any]:
    """The one item of a simple call: its query."""
    return [item_from_query(call.query())]


def only_result(results: list[Any]) -> Any:
    (result,) = results
    return result


def item_from_query(params: list[tuple[str, str]]) -> Any:
    if not params:
        raise InvalidInput("query: expected a parameter, as in /?text=Once+upon+a+time")
    if len(params) == 1:
        return params[0][1]
    return dict(params)


ENDPOINTS = tuple(
    Endpoint(
        route,
        summary=SUMMARY,
        tag=TAG,
        items=Items("query", query_item, only_result),
        response_description="The model's result for the item.",
        parameters=(_QUERY,),
    )
    for route in (SIMPLE_CALL_GET, SIMPLE_CALL_POST)
)
