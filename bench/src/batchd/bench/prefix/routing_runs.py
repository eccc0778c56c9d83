"""The routing part: two replicas with the prefix cache behind two routers, one routing by prompt
prefix, one by load alone (the power of two choices), taking turns with the same requests.

The routers read a real API server with no node (`batchd.testing.kubernetes.routed`): the
benchmark writes the deployment and the replicas' EndpointSlices. The conversations' capacity is
measured through the power-of-two router first in each repeat; then conversations arrive open loop
at `routing_share` of it, through each router. Each replica's cache is small enough
(`routing_cache_bytes`) that it holds about half of what the conversations hold at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
from pathlib import Path

import httpx

from batchd.bench.kit.arrivals import poisson
from batchd.bench.kit.repeats import rotated
from batchd.bench.kit.stats import median
from batchd.bench.prefix import client
from batchd.bench.prefix.analysis import (
    PREFIX,
    ROUTED_CAPACITY,
    ROUTED_CONVERSATIONS,
    ROUTED_HOT,
    ROUTED_UNIQUE,
    TWO_CHOICES,
    Figures,
    Part,
    Runs,
    figures,
    routing_goals,
)
from batchd.bench.prefix.replica_runs import model_dir, replica_manifest, vocabulary_of
from batchd.bench.prefix.workload import HOT, UNIQUE, Options, conversations, endless_conversations, jobs
from batchd.router.prefixes import OUTCOMES
from batchd.testing import servers
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.routed import RouterNamespaces
from batchd.testing.kubernetes.started import benchmark_control_plane
from batchd.testing.promtext import parse_counter

logger = logging.getLogger("batchd.bench.prefix")

SUBJECTS = (PREFIX, TWO_CHOICES)
REPLICAS = 2


async def _routed(options: Options, workdir: Path, started: ControlPlane | None) -> Part:
    directory = model_dir(workdir)
    tokenizer, vocabulary = vocabulary_of(directory)
    shape, window = options.shape, (options.warmup_s, options.warmup_s + options.duration_s)
    document = replica_manifest("gpt2", directory, options, options.routing_cache_bytes)
    cores = sorted(os.sched_getaffinity(0))
    runs: Runs = {}
    rates: list[float] = []

    def keep(load: str, subject: str, found: Figures) -> None:
        runs.setdefault(load, {}).setdefault(subject, []).append(found)
        logger.warning("prefix routing: %s, %s: %.2f req/s, TTFT p90 %.0f ms, hit rate %.2f, %d errors",
                       load, subject, found.rps, found.ttft_p90_ms, found.hit_rate, found.errors)  # fmt: skip

    with contextlib.nullcontext(started) if started is not None else control_plane(workdir) as cluster:
        replicas = [
            servers.start_replica(
                servers.write_manifest(workdir / f"replica-{n}", document),
                workdir / "logs",
                name=f"routed-{n}",
                env={"OMP_NUM_THREADS": str(options.threads), "BATCHD_LOG_LEVEL": "warning"},
                cores={cores[n % len(cores)]},  # one core each: two replicas side by side
                host=cluster.address,
            )
            for n in range(REPLICAS)
        ]
        with servers.running(replicas):
            async with RouterNamespaces(cluster, workdir) as namespaces:
                await namespaces.deploy(
                    "gpt2",
                    *(f"{replica.host}:{replica.port}" for replica in replicas),
                    serves=document["spec"]["model"],
                    batching=document["spec"]["batching"],
                )
                async with (
                    namespaces.router() as prefix,
                    namespaces.router(prefix_routing=False) as two_choices,
                ):
                    urls = {PREFIX: prefix.url, TWO_CHOICES: two_choices.url}
                    admins = {PREFIX: prefix.admin_url, TWO_CHOICES: two_choices.admin_url}
                    for repeat in range(options.repeats):
                        seed = 1000 * (repeat + 1) + 500
                        stream = endless_conversations(tokenizer, shape, seed)
                        outcomes = await client.conversation_loop(
                            urls[TWO_CHOICES],
                            stream,
                            options.routing_conversations,
                            shape.new_tokens,
                            window[1],
                        )
                        capacity = figures(outcomes, *window)
                        keep(ROUTED_CAPACITY, TWO_CHOICES, capacity)
                        rate = options.routing_share * capacity.rps / shape.turns  # conversations a second
                        rates.append(rate * shape.turns)
                        begun = poisson(0.0, window[1], rate, random.Random(seed + 1))
                        arriving = list(
                            zip(begun, conversations(tokenizer, shape, len(begun), seed + 2), strict=True)
                        )
                        for subject in rotated(SUBJECTS, repeat):
                            before = await asyncio.to_thread(routes_of, admins[subject])
                            outcomes = await client.conversations(
                                urls[subject],
                                arriving,
                                shape.new_tokens,
                                options.routing_think_s,
                                seed + 3,
                                caller=_caller(subject, repeat),
                            )
                            routes = await routed_since(admins[subject], before)
                            keep(
                                ROUTED_CONVERSATIONS,
                                subject,
                                dataclasses.replace(figures(outcomes), routes=routes),
                            )
                        for load, workload in ((ROUTED_HOT, HOT), (ROUTED_UNIQUE, UNIQUE)):
                            for subject in rotated(SUBJECTS, repeat):
                                requests = jobs(workload, shape, vocabulary, seed + 4)
                                before = await asyncio.to_thread(routes_of, admins[subject])
                                outcomes = await client.closed_loop(
                                    urls[subject],
                                    requests,
                                    options.clients,
                                    window[1],
                                    caller=_caller(subject, repeat),
                                )
                                routes = await routed_since(admins[subject], before)
                                found = dataclasses.replace(figures(outcomes, *window), routes=routes)
                                keep(load, subject, found)
                        for replica in replicas:
                            replica.check_alive()
    setup = (
        f"{REPLICAS} replicas, each on a core of its own, torch threads {options.threads}, "
        f"max_batch_size {options.max_batch_size}, prefix_cache_bytes {options.routing_cache_bytes >> 20} "
        "MiB each; the conversations' capacity through the power-of-two router "
        f"({options.routing_conversations} conversations at once, no pause); then conversations arriving "
        f"open loop at {options.routing_share:g} of it ({shape.turns} turns, a pause of "
        f"{options.routing_think_s:g} s on average after each answer); one hot prefix and unique prompts, "
        f"closed loops of {options.clients} clients; {options.repeats} repeat(s) of {options.duration_s:g} s "
        f"after {options.warmup_s:g} s of warm-up"
    )
    return Part(setup, runs, routing_goals(runs), {ROUTED_CONVERSATIONS: median(rates)})


def routes_of(admin_url: str) -> dict[str, int]:
    """How the router has routed text-generation requests so far, by outcome (its metrics, on its
    admin port; an outcome it never had, or a router that does not route by prefix, counts nothing)."""
    text = httpx.get(f"{admin_url}/metrics", timeout=10).text
    counts: dict[str, int] = {}
    for outcome in OUTCOMES:
        with contextlib.suppress(LookupError):
            counts[outcome] = int(parse_counter(text, "batchd_router_prefix_routes", {"outcome": outcome}))
    return counts


async def routed_since(admin_url: str, before: dict[str, int]) -> dict[str, int]:
    """How the router routed the requests since `before` (its counts then), by outcome."""
    now = await asyncio.to_thread(routes_of, admin_url)
    return {outcome: count - before.get(outcome, 0) for outcome, count in now.items()}


def _caller(subject: str, repeat: int) -> str:
    """Each subject sends the same requests to the same two replicas: as a caller of its own, so
    that the second never finds the first's blocks (the cache and the router's index are salted by
    caller)."""
    return f"{subject.replace(' ', '-')}-{repeat}"


def control_plane(workdir: Path) -> contextlib.AbstractContextManager[ControlPlane]:
    """The part's API server: its own, on a slot no test worker takes."""
    return benchmark_control_plane(workdir / "control-plane")


def run_routing_part(options: Options, workdir: Path, cluster: ControlPlane | None = None) -> Part:
    """The part, on `cluster` (a `control_plane` started already) or on one it starts."""
    return asyncio.run(_routed(options, workdir, cluster))
