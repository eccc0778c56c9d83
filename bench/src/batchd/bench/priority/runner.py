"""Driving the subjects: both replicas started, then each load on each in turns, every repeat."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path

import uvloop

from batchd.bench.kit import loadgen
from batchd.bench.kit.arrivals import poisson
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import rotated
from batchd.bench.priority.analysis import ClassRun, FairnessRun, PriorityRun, Results, class_run
from batchd.bench.priority.workload import CAPACITY_RPS, PATH, SUBJECTS, Options, model_name, subject_manifest
from batchd.testing import servers

logger = logging.getLogger("batchd.bench.priority")
BODY = b'{"instances": [1]}'


def request(server: servers.ServerProcess, subject: str, headers: dict[str, str]) -> loadgen.Request:
    path = PATH.format(model=model_name(subject))
    return loadgen.Request.post_json(server.host, server.port, path, BODY, headers)


async def open_class(
    server: servers.ServerProcess, subject: str, priority: str, rate: float, options: Options, seed: int
) -> ClassRun:
    dues = poisson(0.0, options.duration_s, rate, random.Random(seed))
    result = await loadgen.scheduled_loop(
        server.host, server.port, request(server, subject, {"batchd-priority": priority}), dues,
        measured_s=options.duration_s, grace_s=options.grace_s, start=time.perf_counter(),
    )  # fmt: skip
    return class_run(result.offered, result.latencies_s, result.answered_due_s, result.refused)


async def priority_load(
    server: servers.ServerProcess, subject: str, options: Options, seed: int
) -> PriorityRun:
    total = options.overload * CAPACITY_RPS
    high_rate, low_rate = total * options.high_share, total * (1 - options.high_share)
    idle_high = await open_class(server, subject, "high", high_rate, options, seed)
    high, low = await asyncio.gather(
        open_class(server, subject, "high", high_rate, options, seed + 1),
        open_class(server, subject, "low", low_rate, options, seed + 2),
    )
    return PriorityRun(idle_high, high, low)


async def fairness_load(server: servers.ServerProcess, subject: str, options: Options) -> FairnessRun:
    def caller(name: str, clients: int) -> asyncio.Future[loadgen.RunResult]:
        sent = request(server, subject, {"batchd-fairness-id": name})
        return asyncio.ensure_future(
            loadgen.closed_loop(server.host, server.port, sent, clients, options.duration_s, warmup_s=1.0)
        )

    heavy = caller("indexer", options.light_clients * options.heavy_factor)
    light = caller("search-page", options.light_clients)
    return FairnessRun((await heavy).throughput_rps, (await light).throughput_rps)


def measure(options: Options, workdir: Path, record: RunRecord) -> Results:
    started = {
        subject: servers.start_replica(
            servers.write_manifest(workdir, subject_manifest(subject)), workdir / "logs"
        )
        for subject in SUBJECTS
    }
    priority: dict[str, list[PriorityRun]] = {subject: [] for subject in SUBJECTS}
    fairness: dict[str, list[FairnessRun]] = {subject: [] for subject in SUBJECTS}
    with servers.running(list(started.values())):
        for repeat in range(options.repeats):
            for subject in rotated(SUBJECTS, repeat):
                server = started[subject]
                logger.info("repeat %d: %s, the priority load, then the fairness load", repeat + 1, subject)
                priority[subject].append(
                    uvloop.run(priority_load(server, subject, options, seed=10 * repeat))
                )
                fairness[subject].append(uvloop.run(fairness_load(server, subject, options)))
                server.check_alive()
    return Results(record, options, CAPACITY_RPS, priority, fairness)
