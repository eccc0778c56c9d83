"""The token-level mix: streamed requests of a high class, alone and then beside a sheddable class
that keeps twice what the replica holds asking; each request's time to its first token, counted
from when it was due (its first Server-Sent Event), and every refusal with its reason."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from batchd.bench.kit import streams
from batchd.bench.kit.arrivals import poisson
from batchd.bench.priority.analysis import GenerationRun, StreamedRun, streamed_run
from batchd.bench.priority.workload import (
    BULK_PROMPT,
    GENERATION_PATH,
    GENERATION_QUEUE,
    HIGH_PROMPT,
    Options,
    generation_name,
)
from batchd.testing.servers import ServerProcess, wait_until

HIGH = {"batchd-priority": "high"}
RETRY_S = 0.25  # how long a refused client of the sheddable class waits before it asks again


@dataclass
class _Seen:
    first_tokens_s: list[float] = field(default_factory=list)
    offered: int = 0
    refused: int = 0
    shed: int = 0

    def run(self) -> StreamedRun:
        return streamed_run(self.offered, self.first_tokens_s, self.refused, self.shed)


def _body(prompt: str, tokens: int) -> dict[str, Any]:
    return {
        "text_input": prompt,
        "parameters": {"temperature": 0, "max_tokens": tokens, "min_new_tokens": tokens},
    }


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    since: float,
    seen: _Seen,
) -> None:
    """One streamed request, read to its end; its first event's time after `since` (loop time)."""
    seen.offered += 1
    answer = await streams.stream(session, url, body, headers)
    if answer.status is not None and answer.status != 200:
        seen.refused += answer.status == 503
        seen.shed += answer.headers.get("batchd-refused") == "shed"
    elif answer.done_s is not None and answer.first_s is not None:
        seen.first_tokens_s.append(answer.first_s - since)
    # An answer that never came or broke off is neither a first token nor a refusal.


async def _high(session: aiohttp.ClientSession, url: str, options: Options, seed: int) -> _Seen:
    """The high class, open loop (Poisson), for `mix_s`."""
    seen = _Seen()
    body = _body(HIGH_PROMPT, options.generation_high_tokens)
    dues = poisson(0.0, options.mix_s, options.generation_high_rps, random.Random(seed))
    await streams.open_loop(
        [(due, None) for due in dues],
        lambda start, due, _: _stream(session, url, body, HIGH, start + due, seen),
    )
    return seen


async def _bulk(session: aiohttp.ClientSession, url: str, options: Options, stop: asyncio.Event) -> _Seen:
    """The sheddable class (the default), closed loop until `stop`: a refused client waits a little."""
    seen = _Seen()
    body = _body(BULK_PROMPT, options.generation_bulk_tokens)

    async def client() -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            refused = seen.refused
            await _stream(session, url, body, {}, loop.time(), seen)
            if seen.refused > refused:
                await asyncio.sleep(RETRY_S)

    await asyncio.gather(*(client() for _ in range(options.generation_bulk_clients)))
    return seen


async def generation_load(server: ServerProcess, subject: str, options: Options, seed: int) -> GenerationRun:
    """The high class alone, then beside the sheddable one; the same arrivals both times."""
    url = f"{server.url}{GENERATION_PATH.format(model=generation_name(subject))}"
    async with streams.session(120) as session:
        idle = await _high(session, url, options, seed)
        stop = asyncio.Event()
        bulk = asyncio.ensure_future(_bulk(session, url, options, stop))
        # The sheddable class fills the rows and its half of the queue first.
        await asyncio.to_thread(
            wait_until,
            lambda: server.load()["queued_items"] >= GENERATION_QUEUE // 2,
            60,
            "the bulk class queued",
        )
        high = await _high(session, url, options, seed)
        stop.set()
        loaded = await bulk
    return GenerationRun(idle.run(), high.run(), loaded.run())
