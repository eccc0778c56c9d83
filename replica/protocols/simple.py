"""The seeds' simple call: `curl "http://localhost:8000/?text=Once+upon+a+time"` answers one result.

The query's single parameter is the item (several parameters make a dict item); GET and POST
both work, as in Ray Serve's tutorial, which POSTs with `params=`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.datastructures import QueryParams
from starlette.responses import Response

from batchd.replica.errors import InvalidInput
from batchd.replica.serving import Replica

router = APIRouter(tags=["Simple"])


def item_from_query(params: QueryParams) -> Any:
    if not params:
        raise InvalidInput("query: expected a parameter, as in /?text=Once+upon+a+time")
    if len(params) == 1:
        return next(iter(params.values()))
    return dict(params)


@router.api_route("/", methods=["GET", "POST"])
async def call(request: Request) -> Response:
    replica: Replica = request.app.state.replica

    async def work() -> Any:
        item = item_from_query(request.query_params)
        (result,) = await replica.infer(request, replica.model_name, [item], "query")
        return result

    return await replica.respond(work)
