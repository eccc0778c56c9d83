"""KServe's V1 protocol: `{"instances": [...]}` in, `{"predictions": [...]}` out, one item per instance."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

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


@router.post("/v1/models/{name}:predict")
async def predict(name: str, request: Request) -> Response:
    replica: Replica = request.app.state.replica

    async def work() -> dict[str, Any]:
        instances = decode_instances(await replica.read_json(request))
        return {"predictions": await replica.infer(request, name, instances, "instances")}

    return await replica.respond(work)


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    replica: Replica = request.app.state.replica
    return {"models": [replica.model_name]}


@router.get("/v1/models/{name}")
async def model_status(name: str, request: Request) -> Response:
    replica: Replica = request.app.state.replica

    async def work() -> dict[str, Any]:
        replica.check_name(name)
        return {"name": name, "ready": replica.ready}

    return await replica.respond(work)
