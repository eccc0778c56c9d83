"""The MiniLM ceiling: the embedder every peer serves, called in-process in a tight loop at one
batch size, no server in the way (run from batchd's environment, which has the model's packages
too). It prints one JSON object: items a second, torch's threads and the process's resident
memory once warm (the model alone, what a server's own memory is measured against).

    python -m batchd.bench.kit.peer_servers.servers.ceiling --batch-size 32 --duration-s 5
"""

from __future__ import annotations

import argparse
import json
import os
import time

from batchd.bench.kit import procstat
from batchd.bench.kit.peer_servers.servers import models
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
    rss_mb = procstat.sample(os.getpid()).rss_bytes / 2**20
    figures = {"items_per_s": calls * args.batch_size / elapsed, "threads": torch.get_num_threads()}
    print(json.dumps({**figures, "rss_mb": rss_mb}))


if __name__ == "__main__":
    main()
