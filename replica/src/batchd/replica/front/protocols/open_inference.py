"""The Open Inference Protocol (V2): inference, health and metadata routes.

`POST /v2/models/{name}/infer` is an endpoint (answered in front of FastAPI, see `asgi`),
with the tensor codec in `v2_tensors`; the health and metadata routes are FastAPI's.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.responses import JSONResponse, Response

from batchd.api import __version__
from batchd.api.routes import V2_INFER
from batchd.api.spec import Datatype
from batchd.replica.errors import openapi_responses
from batchd.replica.front.endpoints import BinaryAnswer, Call, Endpoint, parse_json
from batchd.replica.front.protocols.v2_tensors import (
    decode_inputs,
    encode_outputs,
    shape_answer,
    split_body,
    wanted_outputs,
)
from batchd.replica.replica import Replica

TAG = "Open Inference Protocol V2"
HUNG = "A batch has hung: restart the replica."
UNREADY = "Loading, or shutting down."
router = APIRouter(tags=[TAG])
BINARY = (
    "With the binary tensor data extension, the body is this JSON followed by the tensors' raw "
    "bytes, and the Inference-Header-Content-Length header gives the JSON's length."
)


class RequestInput(BaseModel):
    name: str = Field(min_length=1)
    shape: list[int] = Field(
        min_length=1,
        description="The first dimension is the batch: one item per row.",
        json_schema_extra={"prefixItems": [{"type": "integer", "minimum": 1}]},  # a batch of none is refused
    )
    datatype: Datatype
    # Required in the JSON form, the one this schema describes; with the binary tensor data
    # extension the tensor's bytes follow the JSON instead (`parameters.binary_data_size`).
    data: list[Any] = Field(description="Row-major (absent with binary data: parameters.binary_data_size).")
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


async def infer(call: Call) -> Any:
    header, binary = split_body(call.body, call.header(b"inference-header-content-length"))
    document = parse_json(header)
    items = decode_inputs(document, binary)
    wanted = wanted_outputs(document)
    results = await call.infer(items, "inputs")
    outputs, raw = shape_answer(encode_outputs(results, call.replica.output_specs), wanted)
    answer: dict[str, Any] = {"model_name": call.model_name, "outputs": outputs}
    if isinstance(document.get("id"), str):
        answer["id"] = document["id"]
    return BinaryAnswer(orjson.dumps(answer), raw) if raw else answer


ENDPOINTS = (
    Endpoint(
        V2_INFER,
        summary="Infer (Open Inference Protocol V2)",
        tag=TAG,
        answer=infer,
        request=InferenceRequest,
        response=InferenceResponse,
        description=BINARY,
    ),
)


def _replica(request: Request) -> Replica:
    replica: Replica = request.app.state.replica
    return replica


class LiveAnswer(BaseModel):
    live: bool


def _probe(model: type[BaseModel], meaning: str) -> dict[int | str, dict[str, Any]]:
    """The 503 a probe answers when it does not hold (the kubelet reads the status alone)."""
    return {503: {"model": model, "description": meaning}}


def _probed(answer: dict[str, Any], holds: bool) -> Response:
    return JSONResponse(answer, status_code=200 if holds else 503)


@router.get("/v2/health/live", response_model=LiveAnswer, responses=_probe(LiveAnswer, HUNG))
async def live(request: Request) -> Response:
    is_live = _replica(request).live
    return _probed({"live": is_live}, is_live)


@router.get("/v2/health/ready", response_model=ReadyAnswer, responses=_probe(ReadyAnswer, UNREADY))
async def ready(request: Request) -> Response:
    is_ready = _replica(request).ready
    return _probed({"ready": is_ready}, is_ready)


@router.get("/v2")
async def server_metadata() -> dict[str, Any]:
    return {"name": "batchd", "version": __version__, "extensions": ["binary_tensor_data", "generate"]}


@router.get(
    "/v2/models/{name}/ready",
    response_model=ModelReadyAnswer,
    responses={**openapi_responses(404), **_probe(ModelReadyAnswer, UNREADY)},
)
async def model_ready(name: str, request: Request) -> Response:
    replica = _replica(request)
    replica.check_name(name)
    return _probed({"name": name, "ready": replica.ready}, replica.ready)


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
