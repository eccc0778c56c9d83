"""What the router costs on the trivial adder: the p50 it adds with one request in flight, and its
CPU per request with `in_flight` in flight (from /proc), against going direct in the same rounds."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from batchd.bench.kit import floor
from batchd.bench.kit.loadgen import Request
from batchd.bench.kit.proxycost import Through, measure_through
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import rotated
from batchd.bench.router.analysis import CostResult, CostRound
from batchd.bench.router.options import CostOptions
from batchd.bench.router.standin import routed
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.servers import ServerProcess

MODEL = "adder"
PATH = f"/v1/models/{MODEL}:predict"
BODY = b'{"instances": [1]}'


async def _measure(server: ServerProcess, options: CostOptions, router: ServerProcess) -> Through:
    request = Request.post_json(server.host, server.port, PATH, BODY)
    return await measure_through(
        server.host, server.port, request, router, options.in_flight, options.seconds, warmup_s=0.2
    )


async def run_cost(options: CostOptions, cluster: ControlPlane, workdir: Path, meta: RunRecord) -> CostResult:
    # The cheapest upstream there is, so that what is measured is the router.
    adder = floor.start(workdir, host=cluster.address)
    rounds: list[CostRound] = []
    try:
        async with routed(cluster, workdir, MODEL) as stand_in:  # while the adder starts
            await asyncio.to_thread(adder.wait_ready, 60.0)
            await stand_in.publish(adder)
            router = stand_in.router
            paths = {"direct": adder, "router": router}
            for repeat in range(options.repeats):
                figures: dict[str, Through] = {}
                for name in rotated(list(paths), repeat):
                    print(f"router cost, round {repeat + 1}/{options.repeats}: {name}", flush=True)
                    figures[name] = await _measure(paths[name], options, router)
                    router.check_alive()
                direct, through = figures["direct"], figures["router"]
                rounds.append(
                    CostRound(
                        repeat,
                        direct.p50_ms,
                        through.p50_ms,
                        direct.p99_ms,
                        through.p99_ms,
                        direct.rps,
                        through.rps,
                        through.cpu_us,
                    )
                )
    finally:
        adder.stop()
    return CostResult(meta, dataclasses.asdict(options), rounds)
