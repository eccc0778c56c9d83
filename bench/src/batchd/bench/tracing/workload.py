"""The run: a control plane and a Jaeger, then each model's settings side by side (a router and a
replica each), measured in turns within every repeat; what was exported read back from Jaeger."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from batchd.bench.kit import procstat
from batchd.bench.kit.handlers import TRIVIAL_ADDER
from batchd.bench.kit.loadgen import Request, closed_loop
from batchd.bench.kit.repeats import interleaved
from batchd.bench.kit.stats import percentile
from batchd.bench.tracing.analysis import Round, Stored
from batchd.bench.tracing.options import MODELS, MODES, SAMPLING, Options
from batchd.testing.jaeger import Jaeger
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.routed import RouterNamespaces
from batchd.testing.manifests import manifest
from batchd.testing.models import MINILM_SOURCE, SENTENCE, minilm_mirror
from batchd.testing.servers import ServerProcess, start_replica, write_manifest

logger = logging.getLogger(__name__)

MARKER_SPAN = "b7ad6b7169203331"  # the client's span in the marker request's traceparent
MARKER_TRACE = "5bf92f3577b34da6a3ce929d0e0e4{:03x}"  # the marker request's trace, by model


def service(model: str, mode: str) -> str:
    """The OTEL_SERVICE_NAME of a setting's replica of `model` (`adder-1pct`)."""
    return f"{model}-{mode.replace('%', 'pct')}"


def model_block(model: str) -> dict[str, Any]:
    if model == "adder":
        return {"name": model, "handler": TRIVIAL_ADDER}
    return {"name": model, "task": "feature-extraction", "source": MINILM_SOURCE, "device": "cpu"}


def body(model: str) -> bytes:
    return orjson.dumps({"instances": [1 if model == "adder" else SENTENCE]})


def path(model: str) -> str:
    return f"/v1/models/{model}:predict"


@dataclass
class Setting:
    """One setting of one model: its router, and the replica behind it."""

    mode: str
    router: ServerProcess
    replica: ServerProcess
    sent: int = 0  # requests sent through it, warm-ups included


# The tests' schedule, which the Jaeger fixture sets so that they wait little for spans.
SCHEDULE_DELAY = "OTEL_BSP_SCHEDULE_DELAY"


def tracing_env(backend: Jaeger, mode: str, name: str) -> dict[str, str]:
    """A traced setting's environment, with the span processor's schedule left at the SDK's
    default, as a deployment runs it (an export every 5 s, or at 512 spans queued). The tests'
    100 ms schedule sent an export ten times a second from each traced process, each of a few
    spans at 1% sampling, at about 1.4 ms of CPU each in the exporting thread under the GIL
    (the requests library's own, a third of it reading the environment for proxies): 5-10 us a
    request to the router and as much to the replica, which this benchmark had taken for what a
    request nobody records costs."""
    ratio = SAMPLING[mode]
    if ratio is None:
        return {}
    env = {**backend.environment(ratio), "OTEL_SERVICE_NAME": name}
    del env[SCHEDULE_DELAY]
    return env


@contextlib.asynccontextmanager
async def setting(
    model: str, mode: str, cluster: ControlPlane, backend: Jaeger, workdir: Path
) -> AsyncIterator[Setting]:
    """A setting's replica of `model` and a router in front of it, yielded once both are ready."""
    directory = workdir / model / service(model, mode)
    env = tracing_env(backend, mode, service(model, mode))
    if model == "minilm":
        env |= {"BATCHD_MODEL_MIRROR": str(minilm_mirror(workdir / "mirror")), "HF_HUB_OFFLINE": "1"}
        # One torch thread, as the peers benchmark runs it: on shared cores, OpenMP's threads spin
        # waiting for each other, and their spinning would count as the replica's CPU per request.
        env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    manifest_path = write_manifest(directory, manifest(model, model_block(model)))
    replica = start_replica(manifest_path, directory / "logs", env=env, host=cluster.address)
    try:
        async with RouterNamespaces(cluster, directory) as namespaces:
            await namespaces.create_deployment(model)
            await asyncio.to_thread(replica.wait_ready, 300)
            address = f"{replica.host}:{replica.port}"
            await namespaces.put_slice(namespaces.slice(model, [address], name=f"{model}-0"))
            async with namespaces.router(
                env=tracing_env(backend, mode, f"router-{service(model, mode)}")
            ) as router:
                yield Setting(mode, router, replica)
    finally:
        await asyncio.to_thread(replica.stop)


async def measure(
    subject: Setting, model: str, clients: int, options: Options, repeat: int, backend: int
) -> Round:
    """A warm-up, then the measured closed loop, with each process's CPU read around it."""
    router = subject.router
    request = Request.post_json(router.host, router.port, path(model), body(model))
    warm = await closed_loop(router.host, router.port, request, clients, options.warmup_s)
    pids = (router.pid, subject.replica.pid, backend)
    before = [procstat.sample(pid).cpu_s for pid in pids]
    result = await closed_loop(router.host, router.port, request, clients, options.seconds)
    cpu_us = [
        (procstat.sample(pid).cpu_s - was) / result.completed * 1e6 if result.completed else float("nan")
        for pid, was in zip(pids, before, strict=True)
    ]
    router.check_alive()
    subject.replica.check_alive()
    subject.sent += warm.completed + result.completed + warm.errors + result.errors
    if result.errors:
        logger.warning(
            "%s %s: %d errors, e.g. %s", model, subject.mode, result.errors, result.error_samples[:1]
        )
    return Round(
        model,
        subject.mode,
        repeat,
        clients,
        result.completed,
        result.errors,
        result.throughput_rps,
        percentile(result.latencies_s, 50) * 1000,
        percentile(result.latencies_s, 99) * 1000,
        *cpu_us,
    )


def send_marker(model: str, subject: Setting, marker_trace: str) -> None:
    """The marker request, through a 100% setting: its trace is what `read_back` finds in Jaeger."""
    headers = {"traceparent": f"00-{marker_trace}-{MARKER_SPAN}-01"}
    url = f"{subject.router.url}{path(model)}"
    answer = httpx.post(url, content=body(model), headers=headers, timeout=30)
    answer.raise_for_status()


def read_back(backend: Jaeger, model: str, subject: Setting, marker_trace: str) -> Stored:
    """What Jaeger stored of a traced setting: at 100% the marker request's trace (router, replica
    and batch spans; `send_marker`); at 1% the traces of its replica's service."""
    name = service(model, subject.mode)
    if SAMPLING[subject.mode] == 1.0:
        spans = backend.wait_for_trace(
            marker_trace,
            lambda spans: len({s.service for s in spans}) == 2 and len(spans) >= 3,
            f"the marker request's trace through {name}",
        )
        return Stored(model, subject.mode, subject.sent, len(spans), sorted({s.service for s in spans}))
    traces = backend.traces(name, limit=100_000)
    return Stored(model, subject.mode, subject.sent, len(traces), [name])


@contextlib.asynccontextmanager
async def side_by_side(
    model: str, cluster: ControlPlane, backend: Jaeger, workdir: Path
) -> AsyncIterator[dict[str, Setting]]:
    """Every setting of `model`, started side by side and yielded once all are ready (nothing is
    measured while one starts), then stopped side by side (each stop waits on its own processes);
    one that fails to start cancels the others' starts."""
    stacks = {mode: contextlib.AsyncExitStack() for mode in MODES}
    try:
        async with asyncio.TaskGroup() as group:
            starting = {
                mode: group.create_task(
                    stack.enter_async_context(setting(model, mode, cluster, backend, workdir))
                )
                for mode, stack in stacks.items()
            }
        yield {mode: task.result() for mode, task in starting.items()}
    finally:
        async with asyncio.TaskGroup() as group:
            for stack in stacks.values():
                group.create_task(stack.aclose())


async def run_model(
    model: str, options: Options, cluster: ControlPlane, backend: Jaeger, workdir: Path
) -> tuple[list[Round], list[Stored]]:
    clients = options.adder_clients if model == "adder" else options.minilm_clients
    marker = MARKER_TRACE.format(MODELS.index(model))
    async with side_by_side(model, cluster, backend, workdir) as settings:
        rounds = []
        for repeat, mode in interleaved(MODES, options.repeats):
            if repeat == options.repeats - 1 and SAMPLING[mode] == 1.0:
                # Just before the setting's last round: the marker's spans leave with that
                # round's exports (not at the next scheduled one, up to 5 s on), and its trace
                # is among the newest the store keeps.
                await asyncio.to_thread(send_marker, model, settings[mode], marker)
            print(f"tracing, {model}, repeat {repeat + 1}/{options.repeats}: {mode}", flush=True)
            rounds.append(await measure(settings[mode], model, clients, options, repeat, backend.process.pid))
        stored = [
            await asyncio.to_thread(read_back, backend, model, settings[mode], marker)
            for mode in MODES
            if SAMPLING[mode] == 1.0
        ]
    # The sampled settings' traces are counted once their processes have stopped: each sends the
    # spans it still holds (up to 5 s of them) on its way out.
    stored += [
        await asyncio.to_thread(read_back, backend, model, settings[mode], marker)
        for mode in MODES
        if SAMPLING[mode] not in (None, 1.0)
    ]
    return rounds, stored
