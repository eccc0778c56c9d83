"""What a process in the request path costs (a router, a proxy): latency with one request in flight,
then throughput and that process's CPU per request (from /proc) with many in flight."""

from __future__ import annotations

from dataclasses import dataclass

from batchd.bench.kit import procstat
from batchd.bench.kit.loadgen import Request, closed_loop
from batchd.bench.kit.stats import percentile
from batchd.testing.servers import ServerProcess


@dataclass(frozen=True)
class Through:
    p50_ms: float  # with one request in flight
    p99_ms: float
    rps: float  # with `in_flight` in flight
    cpu_us: float  # the measured process's CPU over that window, per request sent
    requests: int  # answered 200, both windows
    errors: int


async def measure_through(
    host: str,
    port: int,
    request: Request,
    process: ServerProcess,
    in_flight: int,
    seconds: float,
    warmup_s: float,
) -> Through:
    """`request` sent to `host:port`, one at a time and then `in_flight` at a time, for `seconds`
    after `warmup_s` each; `process`'s CPU read over the second."""
    one = await closed_loop(host, port, request, 1, seconds, warmup_s=warmup_s)
    before = procstat.sample(process.pid).cpu_s
    many = await closed_loop(host, port, request, in_flight, seconds, warmup_s=warmup_s)
    cpu_s = procstat.sample(process.pid).cpu_s - before
    # The warm-up's requests count in the CPU too: spread it over all that were sent.
    sent = many.completed * (1 + warmup_s / seconds)
    return Through(
        percentile(one.latencies_s, 50) * 1000,
        percentile(one.latencies_s, 99) * 1000,
        many.throughput_rps,
        cpu_s / sent * 1e6 if sent else float("nan"),
        one.completed + many.completed,
        one.errors + many.errors,
    )
