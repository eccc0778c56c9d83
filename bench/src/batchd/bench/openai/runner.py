"""Running both parts: one replica per part, both of its routes at once at every client count."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import uvloop

from batchd.bench.kit import streams
from batchd.bench.kit.connections import Request, RequestFailed, Session
from batchd.bench.kit.stats import p99_ms
from batchd.bench.openai.analysis import EmbeddingRun, StreamingRun, rate_between_completions
from batchd.bench.openai.workload import (
    CHAT_BATCHING,
    EMBEDDING_ROUTES,
    EMBEDDINGS_BATCHING,
    EMBEDDINGS_MODEL_SPEC,
    NEW_TOKENS,
    STREAMING_ROUTES,
    Route,
    Setup,
    chat_model,
)
from batchd.testing import servers
from batchd.testing.manifests import manifest
from batchd.testing.models import build_gpt2, minilm_mirror

logger = logging.getLogger("batchd.bench.openai")

# Each stream's last event, as each route writes it: the check that an answer came whole.
_ENDS: dict[str, Callable[[bytes], bool]] = {
    "openai": lambda last: last == b"[DONE]",
    "oip_generate_stream": lambda last: b'"done":true' in last,
}
JSON = {"content-type": "application/json"}


def _side_by_side(setup: Setup, repeats: int, measure: Callable[[int, int], None]) -> None:
    """Every repeat of one client count before the next. In each, `measure` drives both routes at
    once, `clients` on each, through one window: the replica's batches mix the two routes' items,
    and whatever else the machine does at that moment falls on both alike. (Taking turns, a route's
    window met a machine up to a quarter faster or slower than the other's.)"""
    for clients in setup.clients:
        for repeat in range(repeats):
            logger.info("%d client(s) on each route, repeat %d", clients, repeat + 1)
            measure(clients, repeat)


def measure_embeddings(setup: Setup, repeats: int, workdir: Path, threads: int) -> list[EmbeddingRun]:
    mirror = minilm_mirror(workdir / "mirror")
    path = servers.write_manifest(
        workdir, manifest("openai-minilm", EMBEDDINGS_MODEL_SPEC, batching=EMBEDDINGS_BATCHING)
    )
    env = {"BATCHD_MODEL_MIRROR": str(mirror), "OMP_NUM_THREADS": str(threads)}
    runs: list[EmbeddingRun] = []
    with servers.replica_process(path, workdir / "logs", env=env) as replica:
        address = urlsplit(replica.url)
        host, port = address.hostname or "127.0.0.1", address.port or 80

        async def both(clients: int) -> list[tuple[float, list[float], int]]:
            requests = [Request.post_json(host, port, route.path, route.body) for route in EMBEDDING_ROUTES]
            return await asyncio.gather(*(_requests(host, port, r, clients, setup) for r in requests))

        def measure(clients: int, repeat: int) -> None:
            measured = uvloop.run(both(clients))
            for route, (rps, latencies, errors) in zip(EMBEDDING_ROUTES, measured, strict=True):
                runs.append(EmbeddingRun(route.label, clients, repeat, rps, p99_ms(latencies), errors))
            replica.check_alive()

        _side_by_side(setup, repeats, measure)
    return runs


async def _requests(
    host: str, port: int, request: Request, clients: int, setup: Setup
) -> tuple[float, list[float], int]:
    """`clients` clients back to back on keep-alive connections: requests/s between completions
    inside the window, the latencies of the requests sent in it, and the failures."""
    loop = asyncio.get_running_loop()
    measure_from = loop.time() + setup.warmup_s
    stop_at = measure_from + setup.duration_s
    done: list[float] = []
    latencies: list[float] = []
    errors = 0

    async def client() -> None:
        nonlocal errors
        session = Session(host, port)
        while (sent := loop.time()) < stop_at:
            try:
                status, _ = await session.send(request)
            except RequestFailed:
                status = 0
            now = loop.time()
            if measure_from <= now <= stop_at:
                done.append(now)
                if status != 200:
                    errors += 1
                elif sent >= measure_from:
                    latencies.append(now - sent)
        session.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return rate_between_completions(done), latencies, errors


async def _streams(url: str, route: Route, clients: int, repeat: int, setup: Setup) -> StreamingRun:
    """`clients` streaming clients back to back; answers that end inside the window count."""
    loop = asyncio.get_running_loop()
    measure_from = loop.time() + setup.warmup_s
    stop_at = measure_from + setup.duration_s
    firsts: list[float] = []
    ends: list[float] = []
    errors = 0
    ended = _ENDS[route.label]

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while (sent := loop.time()) < stop_at:
            answer = await streams.stream(session, url + route.path, route.body, JSON)
            done = loop.time()
            if not measure_from <= done <= stop_at:
                continue  # ended in the warm-up or after the window: not counted
            ends.append(done)
            if answer.done_s is None or answer.first_s is None or not ended(answer.last):
                errors += 1
            elif sent >= measure_from:
                firsts.append(answer.first_s - sent)

    async with streams.session(300) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    tokens_per_s = rate_between_completions(ends) * NEW_TOKENS
    return StreamingRun(
        route.label,
        clients,
        repeat,
        tokens_per_s,
        p99_ms(firsts),
        len(ends),
        errors,
        [round(s * 1000, 3) for s in firsts],
    )


def measure_streaming(setup: Setup, repeats: int, workdir: Path, threads: int) -> list[StreamingRun]:
    model_dir = workdir / "gpt2-tiny"
    if not (model_dir / "config.json").exists():
        build_gpt2(model_dir, n_positions=512)
    path = servers.write_manifest(
        workdir, manifest("openai-gpt2", chat_model(str(model_dir)), batching=CHAT_BATCHING)
    )
    runs: list[StreamingRun] = []
    with servers.replica_process(path, workdir / "logs", env={"OMP_NUM_THREADS": str(threads)}) as replica:

        async def both(clients: int, repeat: int) -> list[StreamingRun]:
            streams = (_streams(replica.url, route, clients, repeat, setup) for route in STREAMING_ROUTES)
            return await asyncio.gather(*streams)

        def measure(clients: int, repeat: int) -> None:
            started = time.perf_counter()
            runs.extend(uvloop.run(both(clients, repeat)))
            replica.check_alive()
            logger.info("  %.1f s", time.perf_counter() - started)

        _side_by_side(setup, repeats, measure)
    return runs
