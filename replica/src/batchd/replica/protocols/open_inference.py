"""The Open Inference Protocol (V2): health and metadata routes.

`POST /v2/models/{name}/infer` is answered by `batchd.replica.inference`, with the tensor
codec in `v2_tensors`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from batchd.api import __version__
from batchd.replica.serving import Replica

router = APIRouter(tags=["Open Inference Protocol V2"])


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
    return {"name": "batchd", "version": __version__, "extensions": ["binary_tensor_data"]}


@router.get("/v2/models/{name}/ready")
async def model_ready(name: str, request: Request) -> Response:
    replica = _replica(request)
    replica.check_name(name)
    return JSONResponse({"name": name, "ready": replica.ready}, status_code=200 if replica.ready else 503)


@router.get("/v2/models/{name}")
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
        "parameters": {"batching_generation": replica.manifest.batching_generation},
    }
