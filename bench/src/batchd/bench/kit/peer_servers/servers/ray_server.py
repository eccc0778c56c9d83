"""Ray Serve: a local Ray cluster, an HTTP proxy actor (uvicorn) and one replica actor that batches
with `@serve.batch`.

    python -m batchd.bench.kit.peer_servers.servers.ray_server --model adder --host H --port P

POST / with `{"instances": [item]}` answers `{"predictions": [answer]}`.
"""

from __future__ import annotations

import threading
from typing import Any

import ray
from ray import serve
from starlette.requests import Request

from batchd.bench.kit.peer_servers.servers import models

# Ray Serve's default (5 in flight a replica) would cap every batch at 5: the load's clients all
# go to the one replica, as they do to every other server here.
MAX_ONGOING_REQUESTS = 1024


@serve.deployment(max_ongoing_requests=MAX_ONGOING_REQUESTS, ray_actor_options={"num_cpus": 0})
class Model:
    def __init__(self, model: str) -> None:
        self.predict_batch = models.load(model)

    @serve.batch(max_batch_size=models.MAX_BATCH_SIZE, batch_wait_timeout_s=models.BATCH_WAIT_S)  # type: ignore[untyped-decorator]
    async def predict(self, items: list[Any]) -> list[Any]:
        return self.predict_batch(items)

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        return {"predictions": [await self.predict(body["instances"][0])]}


def main() -> None:
    args = models.arguments(__doc__.splitlines()[0])
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(Model.bind(args.model), route_prefix="/", name="peer")  # type: ignore[attr-defined]
    threading.Event().wait()  # serve until the benchmark stops the process group


if __name__ == "__main__":
    main()
