"""KServe's V1 protocol: `{"instances": [...]}` in, `{"predictions": [...]}` out, one item per instance.

`POST /v1/models/{name}:predict` is an endpoint of batch items (`Items`: either door answers it);
the model listing and status routes are FastAPI's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from batchd.api.routes import KSERVE_V1_PREDICT
from batchd.replica.errors import InvalidInput, openapi_responses
from batchd.replica.front.endpoints import Call, Endpoint, Items, parse_json
from batchd.replica.front.protocols.openai.models import model_card, model_list, served_names
from batchd.replica.replica import Replica

TAG = "KServe V1"
router = APIRouter(tags=[TAG])


class PredictRequest(BaseModel):
    instances: list[Any] = Field(
        min_length=1, description="One batch item per instance, batched with everybody else's."
    )


class PredictResponse(BaseModel):
    predictions: list[Any] = Field(description="One result per instance, in order.")


def predictions(results: list[Any]) -> dict[str, Any]:
    """The answer to a predict request whose items gave `results`."""
    return {"predictions": results}


def instances(call: Call) -> list[Any]:
    """The items of a predict request: its instances."""
    body = parse_json(call.body)
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


ENDPOINTS = (
    Endpoint(
        KSERVE_V1_PREDICT,
        summary="Predict (KServe V1)",
        tag=TAG,
        items=Items("instances", instances, predictions),
        request=PredictRequest,
        response=PredictResponse,
    ),
)


# KServe V1's model listing and status are OpenAI's too (`openai.models`): one answer holds
# both protocols' fields, so that neither shadows the other.
@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """KServe V1's `models` and OpenAI's list (`object`, `data`)."""
    replica: Replica = request.app.state.replica
    return {"models": [replica.model_name]} | model_list(replica)


@router.get("/v1/models/{name}", responses=openapi_responses(404))
async def model_status(name: str, request: Request) -> dict[str, Any]:
    """KServe V1's `name` and `ready`, and OpenAI's model object (`id`, `object`, `created`,
    `owned_by`); the model's name or its served name."""
    replica: Replica = request.app.state.replica
    if name not in served_names(replica):
        replica.check_name(name)
    return {"name": name, "ready": replica.ready} | model_card(replica)
