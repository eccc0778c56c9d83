"""The Open Inference Protocol (V2): health and metadata routes.

`POST /v2/models/{name}/infer` is answered by `batchd.replica.inference`, in front of FastAPI,
with the tensor codec in `v2_tensors`; it is declared here too, for the OpenAPI document.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.responses import JSONResponse, Response

from batchd.api import __version__
from batchd.api.spec import Datatype
from batchd.replica.errors import openapi_responses
from batchd.replica.protocols.kserve_v1 import SERVED_IN_FRONT
from batchd.replica.serving import Replica

router = APIRouter(tags=["Open Inference Protocol V2"])
BINARY = (
    "With the binary tensor data extension, the body is this JSON followed by the tensors' raw "
    "bytes, and the Inference-Header-Content-Length header gives the JSON's length."
)


class RequestInput(BaseModel):
    name: str = Field(min_length=1)
    shape: list[int] = Field(min_length=1, description="The first dimension is the batch: one item per row.")
    datatype: Datatype
    data: list[Any] | None = Field(default=None, description="Row-major; absent for binary data.")
    parameters: dict[str, Any] | None = Field(default=None, description="`binary_data_size` for binary data.")


class RequestOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = Field(default=None, description="`binary_data`: answer in binary.")


class InferenceRequest(BaseModel):
    id: str | None = None
    parameters: dict[str, Any] | None = Field(
        default=None, description="`binary_data_output`: all in binary."
    )
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] | None = Field(default=None, description="Only these outputs.")


class ResponseOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: Datatype
    data: list[Any] | None = None
    parameters: dict[str, Any] | None = None


class InferenceResponse(BaseModel):
    model_name: str
    id: str | None = None
    outputs: list[ResponseOutput]


class ReadyAnswer(BaseModel):
    ready: bool


class ModelReadyAnswer(BaseModel):
    name: str
    ready: bool


@router.post(
    "/v2/models/{name}/infer",
    response_model=InferenceResponse,
    responses=openapi_responses(400, 404, 413, 500, 503, 504),
    summary="Infer (Open Inference Protocol V2)",
    description=BINARY,
)
async def infer(name: str, body: InferenceRequest) -> InferenceResponse:
    raise NotImplementedError(SERVED_IN_FRONT)


def _replica(request: Request) -> Replica:
    replica: Replica = request.app.state.replica
    return replica


class LiveAnswer(BaseModel):
    live: bool


@router.get(
    "/v2/health/live",
    response_model=LiveAnswer,
    responses={503: {"model": LiveAnswer, "description": "A batch has hung: restart the replica."}},
)
async def live(request: Request) -> Response:
    is_live = _replica(request).live
    return JSONResponse({"live": is_live}, status_code=200 if is_live else 503)


@router.get(
    "/v2/health/ready",
    response_model=ReadyAnswer,
    responses={503: {"model": ReadyAnswer, "description": "Loading, or shutting down."}},
)
async def ready(request: Request) -> Response:
    is_ready = _replica(request).ready
    return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)


@router.get("/v2")
async def server_metadata() -> dict[str, Any]:
    return {"name": "batchd", "version": __version__, "extensions": ["binary_tensor_data", "generate"]}


@router.get(
    "/v2/models/{name}/ready",
    response_model=ModelReadyAnswer,
    responses={
        **openapi_responses(404),
        503: {"model": ModelReadyAnswer, "description": "Loading, or shutting down."},
    },
)
async def model_ready(name: str, request: Request) -> Response:
    replica = _replica(request)
    replica.check_name(name)
    return JSONResponse({"name": name, "ready": replica.ready}, status_code=200 if replica.ready else 503)


@router.get("/v2/models/{name}", responses=openapi_responses(404))
async def model_metadata(name: str, request: Request) -> dict[str, Any]:
    replica = _replica(request)
    replica.check_name(name)
    metadata = replica.model.metadata if replica.model else None
    return {
        "name": name,
        "versions": [],
        "platform": metadata.platform if metadata else "",
        "inputs": [spec.model_dump(mode="json") for spec in metadata.inputs] if metadata else [],
        "outputs": [spec.model_dump(mode="json") for spec in metadata.outputs] if metadata else [],
        # Which spec.batching this replica runs (live retuning), as the operator's status expects.
        "parameters": {"batching_revision": replica.manifest.batching_revision},
    }
