"""What bounding keep-alive connections costs a replica on the trivial path: requests/s, bounded
vs unbounded, rounds interleaved, medians reported.

`batchd serve` replicas of an adder that takes no time (one batch item a request, opportunistic
batching): one with the keep-alive bound off (`BATCHD_KEEPALIVE_MAX_REQUESTS=0`, `..._MAX_AGE_S=0`),
one with the defaults, one with a bound ten times tighter; a closed loop of `--connections`
aiohttp keep-alive connections against each in turn for `--seconds`, `--rounds` times.

    .venv/bin/python replica/benchmarks/keepalive_cost.py [--rounds 5] [--seconds 4] [--connections 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from batchd.testing.manifests import manifest
from batchd.testing.servers import running, start_replica, write_manifest

SETUPS = {
    "unbounded": {"BATCHD_KEEPALIVE_MAX_REQUESTS": "0", "BATCHD_KEEPALIVE_MAX_AGE_S": "0"},
    "defaults (1000 requests, 5 s)": {},
    "tight (100 requests, 1 s)": {"BATCHD_KEEPALIVE_MAX_REQUESTS": "100", "BATCHD_KEEPALIVE_MAX_AGE_S": "1"},
}


async def closed_loop(url: str, seconds: float, connections: int) -> tuple[float, int]:
    """Requests/s over `seconds`, and how many connections the client opened."""
    opened = 0
    tracing = aiohttp.TraceConfig()

    async def created(*_: object) -> None:
        nonlocal opened
        opened += 1

    tracing.on_connection_create_end.append(created)
    done = 0
    stop = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[tracing]) as session:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                async with session.post(url, json={"instances": [1]}) as response:
                    await response.read()
                    assert response.status == 200
                done += 1

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(connections)))
        return done / (time.monotonic() - started), opened


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="keepalive-cost-"))
    trivial = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0}}
    batching = {"max_batch_size": 32, "batch_wait_timeout_s": 0}  # opportunistic: no wait window
    path = write_manifest(directory, manifest("adder", trivial, batching=batching))
    replicas = {
        name: start_replica(path, directory / "logs", name=name.split()[0], env=env)
        for name, env in SETUPS.items()
    }
    rates: dict[str, list[float]] = {name: [] for name in SETUPS}
    opened: dict[str, list[int]] = {name: [] for name in SETUPS}
    with running(list(replicas.values())):
        for _ in range(args.rounds):
            for name, replica in replicas.items():
                rate, connections = await closed_loop(
                    f"{replica.url}/v1/models/adder:predict", args.seconds, args.connections
                )
                rates[name].append(rate)
                opened[name].append(connections)
    for name in SETUPS:
        print(
            f"{name:32s} median {statistics.median(rates[name]):8.0f} req/s "
            f"(rounds: {', '.join(f'{rate:.0f}' for rate in rates[name])}); "
            f"connections opened per round: median {statistics.median(opened[name]):.0f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
