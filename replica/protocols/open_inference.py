"""The Open Inference Protocol (V2): health, metadata and `/v2/models/{name}/infer`."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from batchd.replica.protocols.v2_tensors import decode_inputs, encode_outputs
from batchd.replica.serving import Replica

router = APIRouter(tags=["Open Inference Protocol V2"])

SERVER_NAME = "batchd"


def _replica(request: Request) -> Replica:
    replica: Replica = request.app.state.replica
    return replica


@router.get("/v2/health/live")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/v2/health/ready")
async def ready(request: Request) -> Response:
    is_ready = _replica(request).ready
    return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)


@router.get("/v2")
async def server_metadata() -> dict[str, Any]:
    from batchd.replica import __version__

    return {"name": SERVER_NAME, "version": __version__, "extensions": []}


@router.get("/v2/models/{name}/ready")
async def model_ready(name: str, request: Request) -> Response:
    replica = _replica(request)

    async def work() -> dict[str, Any]:
        replica.check_name(name)
        return {"name": name, "ready": replica.ready}

    response = await replica.respond(work)
    if response.status_code == 200 and not replica.ready:
        response.status_code = 503
    return response


@router.get("/v2/models/{name}")
async def model_metadata(name: str, request: Request) -> Response:
    replica = _replica(request)

    async def work() -> dict[str, Any]:
        replica.check_name(name)
        if replica.model is None:
            return {"name": name, "versions": [], "platform": "", "inputs": [], "outputs": []}
        metadata = replica.model.metadata
        return {
            "name": name,
            "versions": [],
            "platform": metadata.platform,
            "inputs": [dataclasses.asdict(spec) for spec in metadata.inputs],
            "outputs": [dataclasses.asdict(spec) for spec in metadata.outputs],
        }

    return await replica.respond(work)


@router.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request) -> Response:
    replica = _replica(request)

    async def work() -> dict[str, Any]:
        body = await replica.read_json(request)
        items = decode_inputs(body)
        results = await replica.infer(request, name, items, "inputs")
        outputs = replica.model.metadata.outputs if replica.model else ()
        output_name = outputs[0].name if outputs else "output"
        answer: dict[str, Any] = {"model_name": name, "outputs": encode_outputs(results, output_name)}
        if isinstance(body, dict) and isinstance(body.get("id"), str):
            answer["id"] = body["id"]
        return answer

    return await replica.respond(work)
