"""What the replica's keep-alive bound costs on the trivial path: requests/s and connections opened
by a closed loop of keep-alive clients against replicas of an adder that takes no time, the bound
off, at its defaults, and ten times tighter, the setups taking turns within each round.

The bound is what rebalances clients that bypass the router (see the traffic docs): each
connection it closes is one more TCP handshake for the client and the replica.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from batchd.bench.kit.handlers import TrivialAdder
from batchd.bench.kit.loadgen import Request, closed_loop
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import rotated
from batchd.bench.router.analysis import BoundResult, BoundRound
from batchd.bench.router.options import BoundOptions
from batchd.testing.manifests import manifest
from batchd.testing.servers import running, start_replica, write_manifest

MODEL = "adder"
# Each setup is a replica's environment: BATCHD_KEEPALIVE_* are its settings.
SETUPS: dict[str, dict[str, str]] = {
    "no bound": {"BATCHD_KEEPALIVE_MAX_REQUESTS": "0", "BATCHD_KEEPALIVE_MAX_AGE_S": "0"},
    "defaults (1000 requests, 5 s)": {},
    "tight (100 requests, 1 s)": {"BATCHD_KEEPALIVE_MAX_REQUESTS": "100", "BATCHD_KEEPALIVE_MAX_AGE_S": "1"},
}


async def run_bound(options: BoundOptions, workdir: Path, meta: RunRecord) -> BoundResult:
    handler = f"{TrivialAdder.__module__}:{TrivialAdder.__qualname__}.handle_batch"
    batching = {"max_batch_size": 32, "batch_wait_timeout_s": 0}  # opportunistic: no wait window
    path = write_manifest(workdir, manifest(MODEL, handler, batching=batching))
    replicas = {
        setup: start_replica(path, workdir / "logs", name=f"bound-{index}", env=env)
        for index, (setup, env) in enumerate(SETUPS.items())
    }
    rounds: list[BoundRound] = []
    with running(list(replicas.values())):
        for repeat in range(options.repeats):
            for setup in rotated(list(SETUPS), repeat):
                print(f"keep-alive bound, round {repeat + 1}/{options.repeats}: {setup}", flush=True)
                replica = replicas[setup]
                request = Request.post_json(
                    replica.host, replica.port, f"/v1/models/{MODEL}:predict", b'{"instances": [1]}'
                )
                run = await closed_loop(
                    replica.host, replica.port, request, options.connections, options.seconds, warmup_s=0.5
                )
                replica.check_alive()
                rounds.append(
                    BoundRound(repeat, setup, run.throughput_rps, run.errors, run.connections_opened)
                )
    return BoundResult(meta, dataclasses.asdict(options), rounds)
