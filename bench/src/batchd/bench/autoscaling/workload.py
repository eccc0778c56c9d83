"""One subject through the load step on a fresh stand-in cluster, sampled as it goes; then every
repeat of both subjects, taking turns."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import aiohttp

from batchd.bench.autoscaling.analysis import Sample, analyse
from batchd.bench.autoscaling.options import (
    NS,
    START_TIMEOUT_S,
    SUBJECTS,
    Options,
    subject_manifest,
)
from batchd.bench.autoscaling.results import StepResult, SubjectRun
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import rotated
from batchd.testing.apiserver import ApiServer
from batchd.testing.cluster import Cluster
from batchd.testing.operator_runner import api_server, create, eventually, operator_process
from batchd.testing.traffic import Traffic

logger = logging.getLogger("batchd.bench.autoscaling")

LOAD_TIMEOUT = aiohttp.ClientTimeout(total=1.0)


async def _load_of(session: aiohttp.ClientSession, url: str) -> tuple[int, int] | None:
    try:
        async with session.get(f"{url}/load", timeout=LOAD_TIMEOUT) as response:
            body = await response.json()
        return int(body["queued_items"]), int(body["running_items"])
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
        return None  # a replica that is going away; it holds nothing the others must serve


async def _sampler(
    server: ApiServer, cluster: Cluster, name: str, started: float, options: Options, samples: list[Sample]
) -> None:
    """One sample every `sample_s` from the traffic's start until it ends (or this is cancelled)."""
    async with aiohttp.ClientSession() as session:
        for index in range(int(options.step.duration_s / options.sample_s) + 1):
            await asyncio.sleep(max(0.0, started + index * options.sample_s - time.monotonic()))
            t = time.monotonic() - started
            pods = [pod for pod in cluster.pods(name) if pod.ready and not pod.terminating]
            loads = [load for load in await asyncio.gather(*(_load_of(session, p.url) for p in pods)) if load]
            deployment = server.get_object("apps/deployments", NS, name) or {}
            desired = int(deployment.get("spec", {}).get("replicas", 0))
            samples.append(Sample(t, desired, len(pods), sum(q for q, _ in loads), sum(r for _, r in loads)))


async def run_subject(subject: str, options: Options, workdir: Path, repeat: int) -> SubjectRun:
    """One subject through the whole step on a fresh API server, operator and stand-in cluster."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    env = {
        "BATCHD_REPLICA_POLL_INTERVAL_S": str(options.poll_s),
        "BATCHD_DRAIN_DELAY_S": str(options.drain_delay_s),
    }
    samples: list[Sample] = []
    async with (
        api_server(workdir) as server,
        operator_process(server, workdir / "operator.log", env),
        Cluster(server, workdir / "cluster", config_sync_period_s=0.2) as cluster,
    ):
        await create(server, subject_manifest(subject, options))

        def one_ready() -> bool:
            return sum(pod.ready and not pod.terminating for pod in cluster.pods(subject)) == 1

        await eventually(one_ready, timeout_s=START_TIMEOUT_S, what=f"{subject}: one ready replica")
        if subject == "autoscaled":  # the operator has read the replica: the autoscaler is watching

            def observed() -> bool:
                resource = server.get_object("serving.batchd.dev/batcheddeployments", NS, subject) or {}
                return bool((resource.get("status") or {}).get("autoscaling"))

            await eventually(
                observed, timeout_s=30, what=f"{subject}: the operator reading the replica's load"
            )

        traffic = Traffic(
            lambda: cluster.endpoints(subject),
            f"/v1/models/{subject}:predict",
            b'{"instances": [1]}',
            options.step.rate,
        )
        started = time.monotonic()
        sending = asyncio.create_task(traffic.run(options.step.duration_s))
        sampling = asyncio.create_task(_sampler(server, cluster, subject, started, options, samples))
        try:
            outcomes = await sending
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
            if not sending.done():
                traffic.stop()
                await asyncio.gather(sending, return_exceptions=True)
        scale_events = [
            {"reason": event.get("reason"), "message": event.get("message")}
            for event in server.posted_events
            if event.get("reason") in ("ScaledUp", "ScaledDown")
        ]
    return analyse(subject, options, samples, outcomes, scale_events, repeat)


async def run_step(options: Options, workdir: Path, record: RunRecord) -> StepResult:
    runs: dict[str, list[SubjectRun]] = {subject: [] for subject in SUBJECTS}
    for repeat in range(options.repeats):
        order = rotated(SUBJECTS, repeat)
        for subject in order:
            logger.info("repeat %d/%d: %s", repeat + 1, options.repeats, subject)
            run = await run_subject(subject, options, workdir / f"{subject}-{repeat}", repeat)
            figures = run.figures
            logger.info(
                "  %s: p99 in step %.0f ms, 503s %d, unanswered %d, peak ready %d, carried after %s s",
                subject,
                figures.step_p99_ms,
                figures.refused_503_in_step,
                figures.unanswered,
                figures.peak_ready,
                figures.carried_s,
            )
            runs[subject].append(run)
    return StepResult(record, options, runs)
