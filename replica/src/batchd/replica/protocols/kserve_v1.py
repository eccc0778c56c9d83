"""KServe's V1 protocol: `{"instances": [...]}` in, `{"predictions": [...]}` out, one item per instance.

`POST /v1/models/{name}:predict` is answered by `batchd.replica.inference`; the model listing
and status routes are here.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from batchd.replica.errors import InvalidInput
from batchd.replica.serving import Replica

router = APIRouter(tags=["KServe V1"])


def decode_instances(body: Any) -> list[Any]:
    if not isinstance(body, dict):
        raise InvalidInput(
            f"request body: expected a JSON object with 'instances', got {type(body).__name__}"
        )
    instances = body.get("instances")
    if instances is None:
        raise InvalidInput('instances: required; expected {"instances": [item, ...]}')
    if not isinstance(instances, list):
        raise InvalidInput(f"instances: expected a list, got {type(instances).__name__}")
    return instances


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    replica: Replica = request.app.state.replica
    return {"models": [replica.model_name]}


@router.get("/v1/models/{name}")
async def model_status(name: str, request: Request) -> dict[str, Any]:
    replica: Replica = request.app.state.replica
    replica.check_name(name)
    return {"name": name, "ready": replica.ready}
