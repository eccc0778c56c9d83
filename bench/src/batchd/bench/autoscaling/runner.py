"""One subject through the load step in a fresh release of the chart on the test cluster, sampled
as it goes; then every repeat of both subjects, taking turns."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import aiohttp

from batchd.api.pod import REPLICA_PORT
from batchd.bench.autoscaling.analysis import Sample, StepResult, SubjectRun, analyse
from batchd.bench.autoscaling.workload import START_TIMEOUT_S, SUBJECTS, Options, subject_manifest
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import interleaved
from batchd.testing.kubernetes import handlers
from batchd.testing.kubernetes.release import Release, installed
from batchd.testing.kubernetes.started import Cluster
from batchd.testing.traffic import Traffic
from batchd.testing.waiting import eventually

logger = logging.getLogger("batchd.bench.autoscaling")

LOAD_TIMEOUT = aiohttp.ClientTimeout(total=1.0)


async def _load_of(session: aiohttp.ClientSession, url: str) -> tuple[int, int] | None:
    try:
        async with session.get(f"{url}/load", timeout=LOAD_TIMEOUT) as response:
            body = await response.json()
        return int(body["queued_items"]), int(body["running_items"])
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
        return None  # a replica that is going away; it holds nothing the others must serve


def _desired(release: Release, name: str) -> int:
    deployment = release.get("deployment", name) or {}
    return int(deployment.get("spec", {}).get("replicas", 0))


async def _sampler(
    release: Release, name: str, started: float, options: Options, samples: list[Sample]
) -> None:
    """One sample every `sample_s` from the traffic's start until it ends (or this is cancelled)."""
    async with aiohttp.ClientSession() as session:
        for index in range(int(options.step.duration_s / options.sample_s) + 1):
            await asyncio.sleep(max(0.0, started + index * options.sample_s - time.monotonic()))
            t = time.monotonic() - started
            pods = await asyncio.to_thread(release.pods, name, ready=True)
            urls = [f"http://{pod['status']['podIP']}:{REPLICA_PORT}" for pod in pods]
            loads = [load for load in await asyncio.gather(*(_load_of(session, url) for url in urls)) if load]
            desired = await asyncio.to_thread(_desired, release, name)
            samples.append(Sample(t, desired, len(pods), sum(q for q, _ in loads), sum(r for _, r in loads)))


async def run_subject(
    subject: str, options: Options, cluster: Cluster, workdir: Path, repeat: int
) -> SubjectRun:
    """One subject through the whole step in a fresh release of the chart (its router off: the
    load goes to the subject's own Service), with the operator on the chart's ServiceAccount."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    env = {
        "BATCHD_REPLICA_POLL_INTERVAL_S": str(options.poll_s),
        "BATCHD_DRAIN_DELAY_S": str(options.drain_delay_s),
    }
    samples: list[Sample] = []
    with (
        installed(cluster.control_plane, workdir, {"router": {"enabled": False}}) as release,
        release.operator(workdir / "operator.log", env),
    ):
        document = subject_manifest(subject, options)
        document["spec"].update(handlers.pod_spec())  # the SlowAdder, from a ConfigMap
        release.apply(handlers.config_map(), document)

        await asyncio.to_thread(
            eventually,
            lambda: len(release.pods(subject, ready=True)) == 1,
            timeout_s=START_TIMEOUT_S,
            what=f"{subject}: one ready replica",
        )
        if subject == "autoscaled":  # the operator has read the replica: the autoscaler is watching
            await asyncio.to_thread(
                eventually,
                lambda: ((release.get("bd", subject) or {}).get("status") or {}).get("autoscaling"),
                timeout_s=30,
                what=f"{subject}: the operator reading the replica's load",
            )

        url = release.service_url(subject, REPLICA_PORT)  # kube-proxy spreads it
        path = f"/v1/models/{subject}:predict"
        await asyncio.to_thread(release.first_answer, url + path, {"instances": [1]})
        traffic = Traffic(lambda: [url], path, b'{"instances": [1]}', options.step.rate)
        started = time.monotonic()
        sending = asyncio.create_task(traffic.run(options.step.duration_s))
        sampling = asyncio.create_task(_sampler(release, subject, started, options, samples))
        try:
            outcomes = await sending
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
            if not sending.done():
                traffic.stop()
                await asyncio.gather(sending, return_exceptions=True)
        scale_events: list[dict[str, str | None]] = [
            {"reason": reason, "message": message}
            for reason in ("ScaledUp", "ScaledDown")
            for message in release.events(reason, about=subject)
        ]
    return analyse(subject, options, samples, outcomes, scale_events, repeat)


async def run_step(options: Options, cluster: Cluster, workdir: Path, record: RunRecord) -> StepResult:
    runs: dict[str, list[SubjectRun]] = {subject: [] for subject in SUBJECTS}
    for repeat, subject in interleaved(SUBJECTS, options.repeats):
        logger.info("repeat %d/%d: %s", repeat + 1, options.repeats, subject)
        run = await run_subject(subject, options, cluster, workdir / f"{subject}-{repeat}", repeat)
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
