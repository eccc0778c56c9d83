"""Driving the subjects: the replicas started, then each load on each in turns, every repeat."""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from pathlib import Path

import uvloop

from batchd.bench.kit import loadgen
from batchd.bench.kit.arrivals import poisson
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import rotated
from batchd.bench.kit.stats import percentile
from batchd.bench.priority.analysis import (
    ClassRun,
    DeadRun,
    EqualRun,
    FairnessRun,
    GenerationRun,
    PriorityRun,
    Results,
    class_run,
)
from batchd.bench.priority.generation import generation_load
from batchd.bench.priority.workload import (
    CAPACITY_RPS,
    PATH,
    SUBJECTS,
    Options,
    generation_manifest,
    model_name,
    subject_manifest,
)
from batchd.testing import servers
from batchd.testing.models import build_gpt2

logger = logging.getLogger("batchd.bench.priority")
BODY = b'{"instances": [1]}'
# What a replica counts of a request refused while its client still waited, and of one that gave up.
LIVE_REFUSALS = ("queue_full", "shed", "displaced", "queue_timeout")
# The generation replicas compute on one torch thread: on a machine of few cores a second one only
# takes the core of the replica's event loop (and of the load generator), and the tiny model gains
# nothing from it.
ONE_TORCH_THREAD = {"OMP_NUM_THREADS": "1"}


def request(server: servers.ServerProcess, subject: str, headers: dict[str, str]) -> loadgen.Request:
    path = PATH.format(model=model_name(subject))
    return loadgen.Request.post_json(server.host, server.port, path, BODY, headers)


async def open_class(
    server: servers.ServerProcess,
    subject: str,
    headers: dict[str, str],
    rate: float,
    duration_s: float,
    options: Options,
    seed: int,
) -> ClassRun:
    dues = poisson(0.0, duration_s, rate, random.Random(seed))
    result = await loadgen.scheduled_loop(
        server.host, server.port, request(server, subject, headers), dues,
        measured_s=duration_s, grace_s=options.grace_s, start=time.perf_counter(),
    )  # fmt: skip
    return class_run(result.offered, result.latencies_s, result.answered_due_s, result.refused)


def named(priority_class: str) -> dict[str, str]:
    return {"batchd-priority": priority_class}


async def priority_load(
    server: servers.ServerProcess, subject: str, options: Options, seed: int
) -> PriorityRun:
    total = options.overload * CAPACITY_RPS
    high_rate, low_rate = total * options.high_share, total * (1 - options.high_share)
    duration = options.duration_s
    idle_high = await open_class(server, subject, named("high"), high_rate, duration, options, seed)
    high, low = await asyncio.gather(
        open_class(server, subject, named("high"), high_rate, duration, options, seed + 1),
        open_class(server, subject, named("low"), low_rate, duration, options, seed + 2),
    )
    return PriorityRun(idle_high, high, low)


async def fairness_load(server: servers.ServerProcess, subject: str, options: Options) -> FairnessRun:
    def caller(name: str, clients: int) -> asyncio.Future[loadgen.RunResult]:
        sent = request(server, subject, {"batchd-fairness-id": name})
        return asyncio.ensure_future(
            loadgen.closed_loop(
                server.host, server.port, sent, clients, options.duration_s, options.fairness_warmup_s
            )
        )

    heavy = caller("indexer", options.light_clients * options.heavy_factor)
    light = caller("search-page", options.light_clients)
    return FairnessRun((await heavy).throughput_rps, (await light).throughput_rps)


def counted(server: servers.ServerProcess, family: str, label: str) -> dict[str, float]:
    """A replica's counter `family`, summed by the value of `label`."""
    found: dict[str, float] = {}
    for labels, value in re.findall(rf"^{family}\{{([^}}]*)\}} (\S+)$", server.metrics(), re.M):
        key = dict(re.findall(r'(\w+)="([^"]*)"', labels)).get(label, "")
        found[key] = found.get(key, 0.0) + float(value)
    return found


def displaced(server: servers.ServerProcess) -> dict[str, float]:
    """Items whose place a higher class took, by class, so far."""
    found: dict[str, float] = {}
    for labels, value in re.findall(
        r"^batchd_class_refusals_total\{([^}]*)\} (\S+)$", server.metrics(), re.M
    ):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if fields["reason"] == "displaced":
            found[fields["priority_class"]] = float(value)
    return found


async def equal_load(server: servers.ServerProcess, subject: str, options: Options, seed: int) -> EqualRun:
    """`gold` and `silver`, of one priority, half the load each, open loops."""
    rate = options.equal_overload * CAPACITY_RPS / 2
    before = displaced(server)
    gold, silver = await asyncio.gather(
        open_class(server, subject, named("gold"), rate, options.mix_s, options, seed),
        open_class(server, subject, named("silver"), rate, options.mix_s, options, seed + 1),
    )
    after = displaced(server)
    moved = {name: int(after.get(name, 0) - before.get(name, 0)) for name in ("gold", "silver")}
    return EqualRun(gold, silver, moved["gold"], moved["silver"])


async def dead_load(server: servers.ServerProcess, subject: str, options: Options, seed: int) -> DeadRun:
    """A high class that keeps every batch full (closed loops), beside a low class whose requests
    give up after `dead_timeout_s` (their `batchd-timeout-s`): what the replica refused of the
    requests still waited for, and what gave up."""
    rejections, outcomes = (
        counted(server, "batchd_rejections_total", "reason"),
        counted(server, "batchd_requests_total", "outcome"),
    )
    high = request(server, subject, named("high"))
    low_headers = {**named("low"), "batchd-timeout-s": f"{options.dead_timeout_s:g}"}
    high_run, low = await asyncio.gather(
        loadgen.closed_loop(server.host, server.port, high, options.dead_high_clients, options.mix_s),
        open_class(
            server, subject, low_headers, options.dead_low_share * CAPACITY_RPS, options.mix_s, options, seed
        ),
    )
    after_rejections = counted(server, "batchd_rejections_total", "reason")
    after_outcomes = counted(server, "batchd_requests_total", "outcome")
    live_refused = sum(after_rejections.get(r, 0) - rejections.get(r, 0) for r in LIVE_REFUSALS)
    gave_up = after_outcomes.get("timeout", 0) - outcomes.get("timeout", 0)
    p99_ms = percentile([s * 1000 for s in high_run.latencies_s], 99)
    return DeadRun(high_run.completed, p99_ms, low.answered, int(gave_up), int(live_refused))


def measure(options: Options, workdir: Path, record: RunRecord) -> Results:
    logs = workdir / "logs"
    started = {
        subject: servers.start_replica(
            servers.write_manifest(workdir, subject_manifest(subject, options.queue)), logs
        )
        for subject in SUBJECTS
    }
    generators: dict[str, servers.ServerProcess] = {}
    if options.generation:
        model_dir = build_gpt2(workdir / "tiny-gpt2")
        tokens = max(options.generation_high_tokens, options.generation_bulk_tokens)
        for subject in SUBJECTS:
            document = generation_manifest(subject, model_dir, tokens)
            path = servers.write_manifest(workdir, document)
            generators[subject] = servers.start_replica(path, logs, env=ONE_TORCH_THREAD)
    priority: dict[str, list[PriorityRun]] = {subject: [] for subject in SUBJECTS}
    fairness: dict[str, list[FairnessRun]] = {subject: [] for subject in SUBJECTS}
    equal: dict[str, list[EqualRun]] = {subject: [] for subject in SUBJECTS}
    dead: dict[str, list[DeadRun]] = {subject: [] for subject in SUBJECTS}
    generation: dict[str, list[GenerationRun]] = {subject: [] for subject in generators}
    every = [*started.values(), *generators.values()]
    with servers.running(every, waited=every if options.quiet_start else [*started.values()]):
        for repeat in range(options.repeats):
            for subject in rotated(SUBJECTS, repeat + SUBJECTS.index(options.first_subject)):
                server = started[subject]
                logger.info(
                    "repeat %d: %s: priority, fairness, equal and dead-item loads", repeat + 1, subject
                )
                priority[subject].append(
                    uvloop.run(priority_load(server, subject, options, seed=10 * repeat))
                )
                fairness[subject].append(uvloop.run(fairness_load(server, subject, options)))
                equal[subject].append(uvloop.run(equal_load(server, subject, options, seed=10 * repeat + 3)))
                dead[subject].append(uvloop.run(dead_load(server, subject, options, seed=10 * repeat + 5)))
                server.check_alive()
                if subject in generators:
                    generators[subject].wait_ready(servers.READY_TIMEOUT_S)  # at once where it was waited for
                    logger.info("repeat %d: %s: the token-level mix", repeat + 1, subject)
                    run = uvloop.run(
                        generation_load(generators[subject], subject, options, seed=10 * repeat + 7)
                    )
                    generation[subject].append(run)
                    generators[subject].check_alive()
    return Results(record, options, CAPACITY_RPS, priority, fairness, equal, dead, generation)
