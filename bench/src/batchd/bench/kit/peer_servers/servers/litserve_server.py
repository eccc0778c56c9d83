"""LitServe: FastAPI under uvicorn in front, the model in a worker process fed through queues.

    python -m batchd.bench.kit.peer_servers.servers.litserve_server --model adder --host H --port P

POST /predict with `{"instances": [item]}` answers `{"predictions": [answer]}`.
"""

# No `from __future__ import annotations`: LitServe builds its FastAPI route from these methods'
# signatures at run time.
from typing import Any

import litserve

from batchd.bench.kit.peer_servers.servers import models


class Model(litserve.LitAPI):  # type: ignore[misc]  # litserve is untyped
    def __init__(self, model: str) -> None:
        super().__init__(max_batch_size=models.MAX_BATCH_SIZE, batch_timeout=models.BATCH_WAIT_S)
        self.model = model

    def setup(self, device: Any) -> None:
        self.predict_batch = models.load(self.model)

    # Unannotated, as in LitServe's own examples: the body is read as JSON, not validated.
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        return request["instances"][0]

    def batch(self, inputs: list[Any]) -> list[Any]:
        return inputs

    def predict(self, items: list[Any]) -> list[Any]:
        return self.predict_batch(items)

    def unbatch(self, output: list[Any]) -> list[Any]:
        return output

    def encode_response(self, output: Any) -> dict[str, Any]:
        return {"predictions": [output]}


def main() -> None:
    args = models.arguments(__doc__.splitlines()[0])
    server = litserve.LitServer(Model(args.model), accelerator="cpu", devices=1, workers_per_device=1)
    server.run(host=args.host, port=args.port, generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main()
