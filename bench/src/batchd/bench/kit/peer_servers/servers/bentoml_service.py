"""BentoML: `bentoml serve` runs an HTTP server (Starlette under uvicorn) with adaptive batching in
a worker process.

    PEER_MODEL=adder bentoml serve batchd.bench.kit.peer_servers.servers.bentoml_service:Model \
        --host H --port P

POST /predict with `{"instances": [item]}` answers `[answer]`: a batchable API is called with the
requests' lists joined, and each request gets its own slice back.
"""

from __future__ import annotations

import os
from typing import Any

import bentoml

from batchd.bench.kit.peer_servers.servers import models


@bentoml.service(workers=1)
class Model:
    def __init__(self) -> None:
        self.predict_batch = models.load(os.environ[models.MODEL_VARIABLE])

    # BentoML has no fixed wait window: its dispatcher waits as long as it predicts the batch can
    # still answer within max_latency_ms, and refuses (503) what it predicts cannot; its default
    # (60 s) keeps it from refusing anything this load sends, as no other server here does.
    @bentoml.api(batchable=True, max_batch_size=models.MAX_BATCH_SIZE)  # type: ignore[untyped-decorator]
    def predict(self, instances: list[Any]) -> list[Any]:
        return self.predict_batch(instances)
