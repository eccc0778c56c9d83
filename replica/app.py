"""`create_app`: the FastAPI application of one replica, with a lifespan that loads the model.

The app is ready (and `/v2/health/ready` answers 200) only once the model is loaded and warmed;
at shutdown it drains the batcher so that every accepted request gets its answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from batchd.api.spec import BatchedDeployment
from batchd.replica import __version__
from batchd.replica.models.base import BatchModel
from batchd.replica.protocols import kserve_v1, open_inference, simple
from batchd.replica.serving import Replica
from batchd.replica.settings import ReplicaSettings

ModelLoader = Callable[[], BatchModel]


def default_loader(manifest: BatchedDeployment, settings: ReplicaSettings) -> ModelLoader:
    """Load the model the spec names (imported lazily: torch is heavy and only needed here)."""
    from batchd.replica.models import load_model

    return partial(
        load_model,
        manifest.spec.model,
        max_concurrent_batches=manifest.spec.batching.max_concurrent_batches,
        mirror_dir=settings.model_mirror,
        pvc_root=settings.pvc_root,
    )


def create_app(
    manifest: BatchedDeployment, settings: ReplicaSettings, load: ModelLoader | None = None
) -> FastAPI:
    replica = Replica(manifest, settings)
    loader = load or default_loader(manifest, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await replica.start(loader)
        try:
            yield
        finally:
            await replica.stop()

    app = FastAPI(
        title=f"batchd replica: {replica.model_name}",
        version=__version__,
        lifespan=lifespan,
        # The server's own docs stay available; they cost nothing on the request path.
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.replica = replica
    app.include_router(open_inference.router)
    app.include_router(kserve_v1.router)
    app.include_router(simple.router)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(replica.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
