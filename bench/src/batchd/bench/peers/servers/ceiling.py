"""The MiniLM ceiling: the embedder every peer serves, called in-process in a tight loop at one
batch size, no server in the way (run from batchd's environment, which has the model's packages
too). It prints one JSON object: items a second and torch's threads.

    python -m batchd.bench.peers.servers.ceiling --batch-size 32 --duration-s 5
"""

from __future__ import annotations

import argparse
import json
import time

from batchd.bench.peers.servers import models
from batchd.testing.models import SENTENCE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=models.MAX_BATCH_SIZE)
    parser.add_argument("--duration-s", type=float, default=5.0)
    args = parser.parse_args()
    import torch

    embed = models.load_embedder()
    batch = [SENTENCE] * args.batch_size
    calls = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < args.duration_s or calls < 3:
        embed(batch)
        calls += 1
    print(json.dumps({"items_per_s": calls * args.batch_size / elapsed, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
