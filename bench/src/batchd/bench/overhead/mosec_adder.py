"""The trivial adder served by Mosec, with the replica's batching: max batch 32, 10 ms wait.

Run by the interpreter of a virtual environment that has Mosec (never the project's own):

    /tmp/mosec-venv/bin/python mosec_adder.py --host 127.0.0.1 --port 8000

It takes the request body the replica takes (`{"instances": [1]}`) and answers as it does
(`{"predictions": [2]}`), on Mosec's `/inference` route. Standard library and Mosec only.
"""

from __future__ import annotations

import sys
from typing import Any

from mosec import Server, Worker  # type: ignore[import-not-found, unused-ignore]

MAX_BATCH_SIZE = 32
MAX_WAIT_MS = 10


class Adder(Worker):  # type: ignore[misc, unused-ignore]
    def forward(self, data: list[Any]) -> list[Any]:
        return [{"predictions": [n + 1 for n in request["instances"]]} for request in data]


def main() -> None:
    # The benchmark starts every server with --host and --port; Mosec calls the host --address.
    sys.argv = [arg if arg != "--host" else "--address" for arg in sys.argv]
    server = Server()
    server.append_worker(Adder, num=1, max_batch_size=MAX_BATCH_SIZE, max_wait_time=MAX_WAIT_MS)
    server.run()


if __name__ == "__main__":
    main()
