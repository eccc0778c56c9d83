"""Each subject in a fresh release of the chart on the test cluster: the stable revision under
load through the router, a new one shipped, the canary's share sampled as it goes."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import interleaved
from batchd.bench.rollouts.analysis import Results, SubjectRun, subject_run
from batchd.bench.rollouts.workload import NAME, START_TIMEOUT_S, SUBJECTS, Options, subject_manifest
from batchd.testing.kubernetes import handlers
from batchd.testing.kubernetes.release import ONE_ROUTER, Release, installed
from batchd.testing.kubernetes.started import Cluster
from batchd.testing.traffic import Traffic
from batchd.testing.waiting import eventually

logger = logging.getLogger("batchd.bench.rollouts")

VALUES = {"router": {**ONE_ROUTER["router"], "hold": {"timeoutSeconds": 120}}}


def _rollout(release: Release) -> dict[str, Any]:
    found: dict[str, Any] = ((release.get("bd", NAME) or {}).get("status") or {}).get("rollout") or {}
    return found


async def _sample_shares(
    release: Release, shipped: float, every_s: float, into: list[tuple[float, float]]
) -> None:
    while True:
        rollout = await asyncio.to_thread(_rollout, release)
        into.append((time.perf_counter() - shipped, float(rollout.get("canary_percent") or 0)))
        await asyncio.sleep(every_s)


async def run_subject(subject: str, options: Options, cluster: Cluster, workdir: Path) -> SubjectRun:
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    env = {"BATCHD_REPLICA_POLL_INTERVAL_S": str(options.poll_s), "BATCHD_DRAIN_DELAY_S": "1"}
    with (
        installed(cluster.control_plane, workdir, VALUES, wait=True) as release,
        release.operator(workdir / "operator.log", env),
    ):
        release.apply(handlers.config_map(), subject_manifest(subject, options, 1))
        await asyncio.to_thread(
            eventually,
            lambda: len(release.pods(NAME, ready=True)) == 1,
            timeout_s=START_TIMEOUT_S,
            what=f"{subject}: the stable replica",
        )
        url = release.service_url(f"{release.name}-router", 80)
        path = f"/v1/models/{NAME}:predict"
        await asyncio.to_thread(release.first_answer, url + path, {"instances": [1]})
        traffic = Traffic(lambda: [url], path, b'{"instances": [1]}', options.rate)
        started = time.perf_counter()
        good = subject == "canary-good"
        sending = asyncio.create_task(
            traffic.run(options.before_s + (options.promote_timeout_s if good else options.after_s), started)
        )
        shares: list[tuple[float, float]] = []
        sampling: asyncio.Task[None] | None = None
        try:
            await asyncio.sleep(options.before_s)
            shipped = time.perf_counter()
            await asyncio.to_thread(release.apply, subject_manifest(subject, options, 2))
            sampling = asyncio.create_task(_sample_shares(release, shipped, options.sample_s, shares))
            if good:  # until it is promoted, then a little more of the load on the new stable revision
                await asyncio.to_thread(
                    eventually,
                    lambda: _rollout(release).get("phase") == "Promoted",
                    timeout_s=options.promote_timeout_s,
                    what=f"{subject}: the promotion",
                )
                await asyncio.sleep(5)
                traffic.stop()
            outcomes = await sending
        finally:
            if sampling is not None:
                sampling.cancel()
                await asyncio.gather(sampling, return_exceptions=True)
            if not sending.done():
                traffic.stop()
                await asyncio.gather(sending, return_exceptions=True)
        ended = str(_rollout(release).get("phase") or "none")
    return subject_run(outcomes, shipped - started, shares, ended)


async def run_all(options: Options, cluster: Cluster, workdir: Path, record: RunRecord) -> Results:
    runs: dict[str, list[SubjectRun]] = {subject: [] for subject in SUBJECTS}
    for repeat, subject in interleaved(SUBJECTS, options.repeats):
        logger.info("repeat %d/%d: %s", repeat + 1, options.repeats, subject)
        run = await run_subject(subject, options, cluster, workdir / f"{subject}-{repeat}")
        logger.info(
            "  %s: %d of %d failed after the ship, last at %s s; p99 %.0f ms before, %.0f ms during; %s",
            subject,
            run.failed_after,
            run.requests_after,
            run.last_failure_s,
            run.steady_p99_ms,
            run.rollout_p99_ms,
            run.ended,
        )
        runs[subject].append(run)
    return Results(record, options, runs)
