"""What the router costs on the trivial adder: the p50 it adds with one request in flight, and its
CPU per request with `in_flight` in flight (from /proc), against going direct in the same rounds."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import sys
from pathlib import Path

from batchd.bench.kit import procstat
from batchd.bench.kit.loadgen import Request, closed_loop
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import rotated
from batchd.bench.kit.stats import percentile
from batchd.bench.router.analysis import CostResult, CostRound
from batchd.bench.router.options import CostOptions
from batchd.bench.router.standin import routed
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.servers import ServerProcess, start_process
from batchd.testing.waiting import eventually_async

MODEL = "adder"
PATH = f"/v1/models/{MODEL}:predict"
BODY = b'{"instances": [1]}'


def start_adder(workdir: Path, host: str = "127.0.0.1") -> ServerProcess:
    """The cheapest upstream there is (`kit.floor`), so that what is measured is the router."""
    return start_process("floor", [sys.executable, "-m", "batchd.bench.kit.floor"], workdir, host=host)


def listening(server: ServerProcess) -> bool:
    server.check_alive()
    try:
        socket.create_connection((server.host, server.port), timeout=1).close()
    except OSError:
        return False
    return True


async def _measure(
    server: ServerProcess, options: CostOptions, router: ServerProcess
) -> tuple[float, float, float, float]:
    """(p50 ms, p99 ms) with one in flight; (requests/s, router CPU us per request) with `in_flight`."""
    request = Request.post_json(server.host, server.port, PATH, BODY)
    one = await closed_loop(server.host, server.port, request, 1, options.seconds, warmup_s=0.2)
    before = procstat.sample(router.pid).cpu_s
    many = await closed_loop(
        server.host, server.port, request, options.in_flight, options.seconds, warmup_s=0.2
    )
    cpu_s = procstat.sample(router.pid).cpu_s - before
    # The warm-up's requests count in the CPU too: spread it over all that were sent.
    sent = many.completed * (1 + 0.2 / options.seconds)
    return (
        percentile(one.latencies_s, 50) * 1000,
        percentile(one.latencies_s, 99) * 1000,
        many.throughput_rps,
        cpu_s / sent * 1e6 if sent else float("nan"),
    )


async def run_cost(options: CostOptions, cluster: ControlPlane, workdir: Path, meta: RunRecord) -> CostResult:
    adder = start_adder(workdir, cluster.address)
    rounds: list[CostRound] = []
    try:
        await eventually_async(
            lambda: asyncio.to_thread(listening, adder), timeout_s=60.0, what="the trivial adder listening"
        )
        async with routed(cluster, workdir, MODEL, [adder]) as stand_in:
            router = stand_in.router
            paths = {"direct": adder, "router": router}
            for repeat in range(options.repeats):
                figures: dict[str, tuple[float, float, float, float]] = {}
                for name in rotated(list(paths), repeat):
                    print(f"router cost, round {repeat + 1}/{options.repeats}: {name}", flush=True)
                    figures[name] = await _measure(paths[name], options, router)
                    router.check_alive()
                direct, through = figures["direct"], figures["router"]
                rounds.append(
                    CostRound(
                        repeat,
                        direct[0],
                        through[0],
                        direct[1],
                        through[1],
                        direct[2],
                        through[2],
                        through[3],
                    )
                )
    finally:
        adder.stop()
    return CostResult(meta, dataclasses.asdict(options), rounds)
