"""KServe's V1 protocol: `{"instances": [...]}` in, `{"predictions": [...]}` out, one item per instance.

`POST /v1/models/{name}:predict` is answered by `batchd.replica.inference`, in front of FastAPI;
it is declared here too, for the OpenAPI document. The model listing and status routes are here.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from batchd.replica.errors import InvalidInput, openapi_responses
from batchd.replica.serving import Replica

router = APIRouter(tags=["KServe V1"])
# Answered in front of FastAPI (batchd.replica.inference); the declaration documents it.
SERVED_IN_FRONT = "answered by batchd.replica.inference before the request reaches FastAPI"


class PredictRequest(BaseModel):
    instances: list[Any] = Field(
        min_length=1, description="One batch item per instance, batched with everybody else's."
    )


class PredictResponse(BaseModel):
    predictions: list[Any] = Field(description="One result per instance, in order.")


@router.post(
    "/v1/models/{name}:predict",
    response_model=PredictResponse,
    responses=openapi_responses(400, 404, 413, 500, 503, 504),
    summary="Predict (KServe V1)",
)
async def predict(name: str, body: PredictRequest) -> PredictResponse:
    raise NotImplementedError(SERVED_IN_FRONT)


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


@router.get("/v1/models/{name}", responses=openapi_responses(404))
async def model_status(name: str, request: Request) -> dict[str, Any]:
    replica: Replica = request.app.state.replica
    replica.check_name(name)
    return {"name": name, "ready": replica.ready}
