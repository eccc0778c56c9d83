"""Mosec: its Rust HTTP front batches requests and hands them to a Python worker process.

    python -m batchd.bench.kit.peer_servers.servers.mosec_server --model adder --host H --port P

POST /inference with `{"instances": [item]}` answers `{"predictions": [answer]}`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from mosec import Server, Worker

from batchd.bench.kit.peer_servers.servers import models


class Model(Worker):  # type: ignore[misc]  # mosec is untyped
    def __init__(self) -> None:
        super().__init__()
        self.predict = models.load(os.environ[models.MODEL_VARIABLE])

    def forward(self, data: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answers = self.predict([request["instances"][0] for request in data])
        return [{"predictions": [answer]} for answer in answers]


def main() -> None:
    args = models.arguments(__doc__.splitlines()[0])
    os.environ[models.MODEL_VARIABLE] = args.model  # the worker process is spawned: it inherits this
    # Mosec reads its own options from the command line.
    sys.argv = [sys.argv[0], "--address", args.host, "--port", str(args.port), "--log-level", "warning"]
    server = Server()
    server.append_worker(
        Model,
        max_batch_size=models.MAX_BATCH_SIZE,
        max_wait_time=round(models.BATCH_WAIT_S * 1000),  # milliseconds
    )
    server.run()


if __name__ == "__main__":
    main()
