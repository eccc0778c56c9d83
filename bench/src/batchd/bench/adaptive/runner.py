"""Serving and driving the subjects: their manifests, one scheduled run with /metrics polled
alongside, the capacity, and a whole model through every load and repeat."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import uvloop

from batchd.bench.adaptive.analysis import (
    Driven,
    ModelRecord,
    ModelResult,
    RunFigures,
    adaptivity,
    summarise,
    summarise_run,
    verdicts,
)
from batchd.bench.adaptive.workload import (
    ADAPTIVE,
    BURSTY,
    MAX_CONNECTIONS,
    SHARED_DEVICE,
    SLOTS,
    TITLES,
    Options,
    Schedule,
    is_cost_curve,
    schedule_for,
    window_subject,
)
from batchd.bench.kit import loadgen
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import rotated
from batchd.testing import servers
from batchd.testing.manifests import manifest
from batchd.testing.models import MINILM_SOURCE, SENTENCE, minilm_mirror

logger = logging.getLogger("batchd.bench.adaptive")


def model_block(model: str, options: Options) -> dict[str, Any]:
    if is_cost_curve(model):
        init_kwargs = {
            "alpha_s": options.alpha_s,
            "beta_s": options.beta_s,
            "shared_device": model == SHARED_DEVICE,
        }
        return {
            "name": model,
            "handler": "batchd.bench.kit.handlers:CostCurve",
            "init_kwargs": init_kwargs,
            "device": "cpu",
        }
    return {"name": model, "task": "feature-extraction", "source": MINILM_SOURCE, "device": "cpu"}


def subject_manifest(model: str, subject: str, options: Options, objective_s: float | None) -> dict[str, Any]:
    batching: dict[str, Any] = {
        "max_batch_size": options.max_batch_size,
        "max_concurrent_batches": SLOTS.get(model, 1),
        "max_queued_requests": 4096,
        "request_timeout_s": 60,
    }
    if subject == ADAPTIVE:
        assert objective_s is not None
        batching["latency_objective_s"] = objective_s
    else:
        batching["batch_wait_timeout_s"] = float(subject.removesuffix(" ms")) / 1000
    slug = "adaptive" if subject == ADAPTIVE else f"w{subject.removesuffix(' ms')}".replace(".", "-")
    return manifest(f"{model}-{slug}", model_block(model, options), batching=batching)


def request_for(model: str, server: servers.ServerProcess) -> loadgen.Request:
    item: Any = 1 if is_cost_curve(model) else SENTENCE
    body = json.dumps({"instances": [item]}).encode()
    return loadgen.Request.post_json(server.host, server.port, f"/v1/models/{model}:predict", body)


async def drive(
    server: servers.ServerProcess, request: loadgen.Request, schedule: Schedule, options: Options
) -> Driven:
    """The schedule's requests, with the replica's /metrics polled alongside until the schedule ends
    (a bursty run ends idle, and its series goes on to show it)."""
    start = time.perf_counter()
    metrics = loadgen.Poller(server.host, server.port, "/metrics", options.sample_s, start=start)
    async with metrics:
        run = await loadgen.scheduled_loop(
            server.host,
            server.port,
            request,
            schedule.dues,
            measure_from_s=schedule.measure_from_s,
            measured_s=schedule.measured_s,
            max_connections=MAX_CONNECTIONS,
            grace_s=options.grace_s,
            start=start,
        )
        end_s = schedule.measure_from_s + schedule.measured_s
        delay = start + end_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    return Driven(run, [(at, body.decode()) for at, body in metrics.samples])


def measure_run(
    server: servers.ServerProcess, model: str, subject: str, load: str, schedule: Schedule, options: Options
) -> RunFigures:
    driven = uvloop.run(drive(server, request_for(model, server), schedule, options))
    server.check_alive()
    run = summarise_run(driven, schedule, adaptive=subject == ADAPTIVE, keep_series=load == BURSTY)
    if driven.run.errors:
        logger.warning(
            "%s %s %s: %d errors, e.g. %s",
            model,
            subject,
            load,
            driven.run.errors,
            driven.run.error_samples[:1],
        )
    return run


def measure_capacity(server: servers.ServerProcess, model: str, options: Options) -> list[float]:
    """Closed loop at options.capacity_clients against the 0 ms window: full batches back to back."""
    request = request_for(model, server)
    runs = []
    for index in range(options.capacity_runs):
        warmup_s = options.capacity_warmup_s if index == 0 else options.capacity_warmup_s / 2
        result = loadgen.run(
            loadgen.closed_loop(
                server.host, server.port, request, options.capacity_clients, options.capacity_s, warmup_s
            )
        )
        if result.errors:
            raise RuntimeError(
                f"capacity run of {model}: {result.errors} errors, e.g. {result.error_samples[:1]}"
            )
        runs.append(result.throughput_rps)
    return runs


def run_model(model: str, options: Options, workdir: Path, record: RunRecord) -> ModelResult:
    """Every subject of `model` under every load of every repeat; `record` says how it was run."""
    assets = workdir / "assets"
    logs = workdir / "logs"
    env = {"BATCHD_MODEL_MIRROR": str(minilm_mirror(assets / "mirror"))} if model == "minilm" else {}
    began = time.time()
    load_average_before = os.getloadavg()[0]
    fixed = [subject for subject in options.subjects if subject != ADAPTIVE]
    started: dict[str, servers.ServerProcess] = {}
    for subject in fixed:
        path = servers.write_manifest(workdir, subject_manifest(model, subject, options, None))
        started[subject] = servers.start_replica(path, logs, env=env)
    runs: dict[tuple[str, str], list[RunFigures]] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(servers.running(list(started.values())))
        zero = started[window_subject(0.0)] if window_subject(0.0) in started else started[fixed[0]]
        logger.info(
            "[%s] capacity: closed loop, %d clients, %s window", model, options.capacity_clients, zero.name
        )
        capacity_runs = measure_capacity(zero, model, options)
        capacity = max(capacity_runs)  # a neighbour's burst of CPU can only lower a run
        full_batch_s = options.max_batch_size / capacity
        objective_s = round(options.objective_factor * full_batch_s, 3)
        logger.info(
            "[%s] capacity %.0f items/s; adaptive objective %.0f ms", model, capacity, objective_s * 1000
        )
        path = servers.write_manifest(workdir, subject_manifest(model, ADAPTIVE, options, objective_s))
        started[ADAPTIVE] = servers.start_replica(path, logs, env=env)
        stack.enter_context(servers.running([started[ADAPTIVE]]))
        subjects = list(options.subjects)
        for repeat in range(options.repeats):
            order = rotated(subjects, repeat)
            for load in options.loads:
                # The same arrival times for every subject of this repeat and load.
                schedule = schedule_for(
                    load, capacity, options, random.Random(f"{options.seed}-{model}-{load}-{repeat}")
                )
                for subject in order:
                    logger.info(
                        "[%s] repeat %d/%d: %s, %s (%d requests)",
                        model, repeat + 1, options.repeats, subject, load, len(schedule.dues),
                    )  # fmt: skip
                    run = measure_run(started[subject], model, subject, load, schedule, options)
                    runs.setdefault((subject, load), []).append(run)
                    time.sleep(options.pause_s)
    by_subject = {subject: {load: runs[(subject, load)] for load in options.loads} for subject in subjects}
    summary = summarise(by_subject)
    full_batch_s = options.alpha_s + options.beta_s * options.max_batch_size
    meta = ModelRecord(
        **asdict(record),
        load_average_before=load_average_before,
        load_average_after=os.getloadavg()[0],
        minutes=round((time.time() - began) / 60, 1),
    )
    return ModelResult(
        meta=meta,
        options=options,
        model=model,
        title=TITLES[model],
        capacity_rps=capacity,
        capacity_runs_rps=capacity_runs,
        objective_s=objective_s,
        exit_codes={subject: server.process.returncode for subject, server in started.items()},
        runs=by_subject,
        summary=summary,
        verdicts=verdicts(summary, options),
        adaptivity=adaptivity(by_subject[ADAPTIVE][BURSTY], capacity, options),
        curve_capacity_rps=options.max_batch_size / full_batch_s if is_cost_curve(model) else math.nan,
    )
