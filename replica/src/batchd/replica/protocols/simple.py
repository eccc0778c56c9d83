"""The seeds' simple call: `curl "http://localhost:8000/?text=Once+upon+a+time"` answers one result.

The query's single parameter is the item (several parameters make a dict item); GET and POST
both work, as in Ray Serve's tutorial, which POSTs with `params=`. The route itself is answered
by `batchd.replica.inference`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from batchd.replica.errors import InvalidInput, openapi_responses
from batchd.replica.protocols.kserve_v1 import SERVED_IN_FRONT

router = APIRouter(tags=["Simple call"])
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


_DOCUMENTED = {
    "responses": {
        200: {"description": "The model's result for the item.", "content": {"application/json": {}}},
        **openapi_responses(400, 413, 500, 503, 504),
    },
    "openapi_extra": {"parameters": [_QUERY]},
    "summary": "The seeds' simple call",
}


@router.get("/", operation_id="simple_call_get", **_DOCUMENTED)  # type: ignore[arg-type]
@router.post("/", operation_id="simple_call_post", **_DOCUMENTED)  # type: ignore[arg-type]
async def simple_call() -> Any:
    raise NotImplementedError(SERVED_IN_FRONT)


def item_from_query(params: list[tuple[str, str]]) -> Any:
    if not params:
        raise InvalidInput("query: expected a parameter, as in /?text=Once+upon+a+time")
    if len(params) == 1:
        return params[0][1]
    return dict(params)
