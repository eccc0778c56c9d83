"""The runs: every subject started once, pinned to the server core, then measured in turn within
each repeat under the same closed loop, the load generator pinned to the other cores."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import uvloop

from batchd.bench.kit import loadgen
from batchd.bench.kit.processtree import tree_cpu_s
from batchd.bench.kit.repeats import rotated
from batchd.bench.kit.stats import percentile
from batchd.bench.overhead import subjects
from batchd.bench.overhead.results import Measurement
from batchd.testing import servers

logger = logging.getLogger("batchd.bench")


@dataclass(frozen=True)
class Options:
    repeats: int = 5
    clients: int = 128
    duration_s: float = 5.0
    warmup_s: float = 1.0
    subjects: tuple[str, ...] = ("batchd", "bare")
    baseline_src: Path | None = None
    mosec_python: Path | None = None


def cores() -> tuple[set[int] | None, set[int] | None]:
    """The server on the first core, the load generator on the others (unpinned on one core)."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None, None
    return {available[0]}, set(available[1:])


async def measure(
    server: servers.ServerProcess, subject: subjects.Subject, repeat: int, options: Options
) -> Measurement:
    """One closed loop; the server's CPU is read when the warm-up ends and when the window closes
    (the loop counts only the answers that come within that window)."""
    request = loadgen.Request.post_json(server.host, server.port, subject.path, subjects.BODY)
    load = asyncio.ensure_future(
        loadgen.closed_loop(
            server.host, server.port, request, options.clients, options.duration_s, options.warmup_s
        )
    )
    await asyncio.sleep(options.warmup_s)  # timing the window, not waiting for a state
    before = tree_cpu_s(server.pid)
    await asyncio.sleep(options.duration_s)
    after = tree_cpu_s(server.pid)
    result = await load
    server.check_alive()
    return Measurement(
        subject=subject.name,
        repeat=repeat,
        requests=result.completed,
        errors=result.errors,
        throughput_rps=result.throughput_rps,
        p50_ms=percentile(result.latencies_s, 50) * 1000,
        p99_ms=percentile(result.latencies_s, 99) * 1000,
        server_cpu_s=after - before,
        client_cpu_s=result.client_cpu_s,
    )


def chosen(options: Options) -> list[subjects.Subject]:
    by_name = {s.name: s for s in subjects.ALL}
    return [by_name[name] for name in options.subjects]


def run(options: Options, workdir: Path) -> list[Measurement]:
    """Start every subject, then `repeats` rounds in which each takes its turn (rotated)."""
    server_cores, client_cores = cores()
    measurements: list[Measurement] = []
    with ExitStack() as stack:
        started: list[tuple[subjects.Subject, servers.ServerProcess]] = []
        for subject in chosen(options):
            process = subjects.start(
                subject, workdir, server_cores, options.baseline_src, options.mosec_python
            )
            stack.callback(process.stop)
            started.append((subject, process))
        for _, process in started:
            process.wait_ready(180)
        own_cores = os.sched_getaffinity(0)
        if client_cores:
            os.sched_setaffinity(0, client_cores)
        try:
            for repeat in range(options.repeats):
                for subject, process in rotated(started, repeat):
                    measurement = uvloop.run(measure(process, subject, repeat, options))
                    logger.info(
                        "repeat %d %s: %.0f req/s, p99 %.1f ms, %.4f ms CPU/request",
                        repeat, subject.name, measurement.throughput_rps, measurement.p99_ms,
                        measurement.server_cpu_ms_per_request,
                    )  # fmt: skip
                    measurements.append(measurement)
        finally:
            os.sched_setaffinity(0, own_cores)
    return measurements


def check_subjects(names: Sequence[str], options: Options) -> str | None:
    """Why these subjects cannot run with these options, or None."""
    known = [s.name for s in subjects.ALL]
    for name in names:
        if name not in known:
            return f"--subjects: expected some of {', '.join(known)}, got {name!r}"
    if "baseline" in names and options.baseline_src is None:
        return "--subjects: baseline needs --baseline-src (a replica source tree: replica/src at a git ref)"
    if "mosec" in names and options.mosec_python is None:
        return f"--subjects: mosec needs --mosec-python or {subjects.MOSEC_PYTHON_ENV}"
    return None
