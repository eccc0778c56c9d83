"""`create_app`: the ASGI application of one replica, with a lifespan that loads the model.

The server listens from the start: `/v2/health/live` answers 200 while the model loads, and
`/v2/health/ready` only once it is loaded and warmed; at shutdown the batcher drains so that
every accepted request gets its answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from prometheus_client.exposition import choose_encoder
from starlette.responses import Response

from batchd.api import __version__
from batchd.api.access import read_key_secrets
from batchd.api.spec import BatchedDeployment
from batchd.replica.errors import http_error
from batchd.replica.front.asgi import InferenceRoutes
from batchd.replica.front.gate import Gate
from batchd.replica.front.openapi import document
from batchd.replica.front.protocols import ENDPOINTS, kserve_v1, open_inference
from batchd.replica.models.base import BatchModel
from batchd.replica.replica import Replica
from batchd.replica.retuning import watch_manifest
from batchd.replica.settings import ReplicaSettings
from batchd.replica.traces import Tracing

ModelLoader = Callable[[], BatchModel]


def default_loader(manifest: BatchedDeployment, settings: ReplicaSettings) -> ModelLoader:
    """Load the model the spec names (imported lazily: torch is heavy and only needed here)."""
    from batchd.replica.loading import load_model

    return partial(
        load_model,
        manifest.spec.model,
        mirror_dir=settings.model_mirror,
        pvc_root=settings.pvc_root,
        calls=settings.calls,
        composer=manifest.metadata.name,
    )


def create_app(
    manifest: BatchedDeployment,
    settings: ReplicaSettings,
    load: ModelLoader | None = None,
    manifest_path: Path | None = None,
    tracing: Tracing | None = None,
) -> InferenceRoutes:
    """The replica's ASGI app; with `manifest_path`, changes to that file's batching retune it live;
    with `tracing`, its requests and batches are traced."""
    replica = Replica(manifest, settings, tracing)
    loader = load or default_loader(manifest, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The model loads in the background: the server listens at once, live but not ready,
        # as the kubelet's startup probe and KServe users expect.
        background = [asyncio.create_task(replica.start(loader), name="batchd-load-model")]
        if manifest_path is not None:
            watch = watch_manifest(replica, manifest_path, settings.config_poll_s)
            background.append(asyncio.create_task(watch, name="batchd-watch-manifest"))
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await replica.stop()

    app = FastAPI(
        title=f"batchd replica: {replica.model_name}",
        version=__version__,
        lifespan=lifespan,
        # The server's own docs stay available; they cost nothing on the request path.
        docs_url="/docs",
        redoc_url=None,
        # FastAPI's own OpenTelemetry spans would cover only what it serves here: the kubelet's
        # probes and the operator's /load polls, several a second and nobody's request. The
        # inference routes, in front of it, have the replica's spans (`batchd.replica.tracing`).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.replica = replica
    app.include_router(open_inference.router)
    app.include_router(kserve_v1.router)
    app.openapi = partial(document, app, ENDPOINTS)  # type: ignore[method-assign]

    @app.get("/load", tags=["batchd"])
    async def load_now() -> dict[str, Any]:
        """Items queued and in the model, and the batching generation: what the operator reads."""
        return replica.load()

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        # OpenMetrics where the scraper asks for it (Prometheus does): only it carries exemplars.
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(replica.metrics.registry), media_type=content_type)

    @app.exception_handler(LookupError)
    async def not_served(request: Request, error: Exception) -> Response:
        answer = http_error(error)
        return Response(orjson.dumps(answer.body), status_code=answer.status, media_type="application/json")

    # What uvicorn runs: the inference routes in front, the FastAPI app behind (`.replica`, `.app`).
    keys = None if settings.api_keys_file is None else read_key_secrets(settings.api_keys_file)
    gate = Gate.reading(lambda: replica.manifest, settings.signing_key_file, keys)
    return InferenceRoutes(app, replica, ENDPOINTS, gate)
