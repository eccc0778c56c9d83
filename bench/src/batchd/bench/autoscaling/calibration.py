"""`calibrate`: the items one replica holds (queued + running) against its utilization, which is
what the default `target_ongoing_items` stands for."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import uvloop

from batchd.bench.autoscaling.analysis import Calibration, CalibrationRow
from batchd.bench.autoscaling.workload import HANDLER
from batchd.bench.kit import loadgen
from batchd.bench.kit.formatting import number
from batchd.bench.kit.stats import mean, percentile
from batchd.testing import servers
from batchd.testing.manifests import manifest

logger = logging.getLogger("batchd.bench.autoscaling")

CALIBRATION_SHAPES = ((8, 0.1), (32, 0.2))  # (max_batch_size, seconds per batch)
CALIBRATION_UTILIZATIONS = (0.25, 0.50, 0.70, 0.85, 0.95, 1.10)


async def _ongoing_during(
    host: str, port: int, rate_rps: float, duration_s: float, warmup_s: float, interval_s: float = 0.05
) -> tuple[loadgen.RunResult, list[tuple[int, int]]]:
    """Open-loop load at `rate_rps`, with the replica's /load sampled every `interval_s` after warm-up."""
    request = loadgen.Request.post_json(host, port, "/v1/models/calibrate:predict", b'{"instances": [1]}')
    async with loadgen.Poller(host, port, "/load", interval_s, delay_s=warmup_s) as load:
        result = await loadgen.open_loop(host, port, request, rate_rps, duration_s + warmup_s)
    held = [json.loads(body) for _, body in load.samples]
    return result, [(int(items["queued_items"]), int(items["running_items"])) for items in held]


async def _drained(host: str, port: int, timeout_s: float = 120) -> None:
    """Wait until the replica holds nothing, so that one rate's backlog is not the next one's."""
    connection = await loadgen.Connection.open(host, port)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _, body = await connection.call(loadgen.Request.get(host, port, "/load"))
            load = json.loads(body)
            if load["queued_items"] == 0 and load["running_items"] == 0:
                return
            await asyncio.sleep(0.1)
    finally:
        connection.close()


def calibrate(
    duration_s: float,
    warmup_s: float,
    workdir: Path,
    batch_wait_s: float,
    shapes: tuple[tuple[int, float], ...] = CALIBRATION_SHAPES,
) -> list[CalibrationRow]:
    """For each shape and utilization: mean ongoing items, as a multiple of max_batch_size."""
    rows: list[CalibrationRow] = []
    for max_batch, batch_s in shapes:
        capacity = max_batch / batch_s
        document = manifest(
            "calibrate",
            {"handler": HANDLER, "init_kwargs": {"delay_s": batch_s}},
            batching={"max_batch_size": max_batch, "batch_wait_timeout_s": batch_wait_s},
        )
        path = servers.write_manifest(workdir / f"b{max_batch}", document)
        with servers.replica_process(path, workdir / f"b{max_batch}") as replica:
            for utilization in CALIBRATION_UTILIZATIONS:
                rate = capacity * utilization
                result, samples = uvloop.run(
                    _ongoing_during(replica.host, replica.port, rate, duration_s, warmup_s)
                )
                row = _row(max_batch, batch_s, utilization, result, samples)
                rows.append(row)
                logger.info(
                    "batch %d @ %.1f s, %.0f%% (%.0f req/s): ongoing %.1f = %.2f x max_batch_size",
                    max_batch, batch_s, utilization * 100, rate, row.mean_ongoing, row.ongoing_over_batch,
                )  # fmt: skip
                uvloop.run(_drained(replica.host, replica.port))
    return rows


def _row(
    max_batch: int,
    batch_s: float,
    utilization: float,
    result: loadgen.RunResult,
    samples: list[tuple[int, int]],
) -> CalibrationRow:
    ongoing = [queued + running for queued, running in samples]
    half = len(ongoing) // 2
    mean_ongoing = mean(ongoing)
    return CalibrationRow(
        max_batch_size=max_batch,
        batch_s=batch_s,
        capacity_rps=max_batch / batch_s,
        utilization=utilization,
        rate_rps=max_batch / batch_s * utilization,
        served_rps=result.throughput_rps,
        errors=result.errors,
        samples=len(ongoing),
        mean_ongoing=mean_ongoing,
        mean_queued=mean([queued for queued, _ in samples]),
        mean_running=mean([running for _, running in samples]),
        first_half_ongoing=mean(ongoing[:half]),
        second_half_ongoing=mean(ongoing[half:]),
        p50_ms=percentile(result.latencies_s, 50) * 1000,
        p99_ms=percentile(result.latencies_s, 99) * 1000,
        littles_law_items=result.throughput_rps * (mean(result.latencies_s) if result.latencies_s else 0.0),
        ongoing_over_batch=mean_ongoing / max_batch,
    )


def calibration_markdown(calibration: Calibration) -> str:
    lines = [
        "## Calibration: items a replica holds against its utilization",
        "",
        f"One replica (SlowAdder, batch wait {calibration.batch_wait_s} s, one batch at a time), "
        f"open-loop load for {calibration.duration_s:g} s per rate after {calibration.warmup_s:g} s "
        "of warm-up; ongoing = queued + running items from `GET /load` every 50 ms. Little's law "
        "(served rate x mean latency) cross-checks the mean.",
        "",
        "| shape | utilization | offered req/s | served req/s | mean ongoing | x max_batch_size "
        "| 1st half / 2nd half | Little's law | p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in calibration.rows:
        # Past capacity the queue grows for as long as the load lasts: the mean is only where it got to.
        growing = row.second_half_ongoing - row.first_half_ongoing > row.max_batch_size
        lines.append(
            f"| {row.max_batch_size} @ {row.batch_s} s | {row.utilization:.0%} "
            f"| {number(row.rate_rps, 0)} | {number(row.served_rps, 0)} | {number(row.mean_ongoing)} "
            f"| {number(row.ongoing_over_batch, 2)}{' (growing)' if growing else ''} "
            f"| {number(row.first_half_ongoing)} / {number(row.second_half_ongoing)} "
            f"| {number(row.littles_law_items)} | {number(row.p50_ms, 0)} | {number(row.p99_ms, 0)} |"
        )
    return "\n".join(lines) + "\n"
