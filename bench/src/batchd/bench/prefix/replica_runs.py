"""The replica part: one replica with the prefix cache and one without, the same requests to each in
turn, every workload, every repeat.

Both replicas run all along, on the servers' core (they start side by side on every core, and move
there once up); only the one being measured has load. Each repeat draws new prompts, so that no
run finds what an earlier one left in the cache.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from pathlib import Path
from typing import Any

import uvloop

from batchd.bench.kit.arrivals import poisson
from batchd.bench.kit.repeats import rotated
from batchd.bench.kit.stats import median
from batchd.bench.prefix import client
from batchd.bench.prefix.analysis import (
    CACHED,
    CONVERSATION_TURNS,
    HOT_CAPACITY,
    SYSTEM_CAPACITY,
    SYSTEM_LATENCY,
    UNCACHED,
    UNIQUE_CAPACITY,
    Part,
    Runs,
    figures,
    replica_goals,
)
from batchd.bench.prefix.workload import (
    GPT2_CONFIG,
    HOT,
    MODEL,
    SYSTEM_PROMPTS,
    UNIQUE,
    Options,
    conversations,
    jobs,
    timed,
)
from batchd.testing import servers
from batchd.testing.manifests import manifest
from batchd.testing.models import GPT2_CHAT_TEMPLATE, build_gpt2

logger = logging.getLogger("batchd.bench.prefix")

SUBJECTS = (CACHED, UNCACHED)
# The turn from which the conversations' time to first token counts: by then each has a history.
FROM_TURN = 3


def model_dir(workdir: Path) -> Path:
    """The tiny GPT-2 of the tests, its context 1,024 tokens, built once per run."""
    directory = workdir / "gpt2-1024"
    if not (directory / "config.json").exists():
        build_gpt2(directory, **GPT2_CONFIG)
    return directory


def replica_manifest(name: str, directory: Path, options: Options, cache_bytes: int) -> dict[str, Any]:
    new = options.shape.new_tokens
    model = {
        "name": MODEL,
        "task": "text-generation",
        "source": f"file://{directory}",
        "device": "cpu",
        # Greedy, and every answer as long as it asks (the end-of-sequence token held back).
        "call_kwargs": {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False},
        "generation": {
            "max_new_tokens": new,
            "chat_template": GPT2_CHAT_TEMPLATE,
            "prefix_cache_bytes": cache_bytes,
        },
    }
    batching = {
        "max_batch_size": options.max_batch_size,
        "max_queued_requests": 4096,
        "request_timeout_s": 600,
    }
    return manifest(name, model, batching=batching)


def vocabulary_of(directory: Path) -> tuple[Any, int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    return tokenizer, len(tokenizer)


def pin(server: servers.ServerProcess, cores: set[int]) -> None:
    """Every thread of a running server onto `cores`; the threads it starts later inherit them."""
    for task in Path(f"/proc/{server.pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), cores)


def run_replica_part(
    options: Options, workdir: Path, server_cores: set[int] | None, start_cores: set[int] | None = None
) -> Part:
    """The part; the replicas start on `start_cores` (side by side, where there are several) and
    are measured on `server_cores`."""
    directory = model_dir(workdir)
    tokenizer, vocabulary = vocabulary_of(directory)
    shape, window = options.shape, (options.warmup_s, options.warmup_s + options.duration_s)
    env = {"OMP_NUM_THREADS": str(options.threads), "BATCHD_LOG_LEVEL": "warning"}
    started = {
        subject: servers.start_replica(
            servers.write_manifest(workdir, replica_manifest(name, directory, options, cache)),
            workdir / "logs",
            env=env,
            cores=start_cores or server_cores,
        )
        for subject, name, cache in (
            (CACHED, "cached", options.prefix_cache_bytes),
            (UNCACHED, "uncached", 0),
        )
    }
    runs: Runs = {}
    rates: dict[str, list[float]] = {}

    def keep(load: str, subject: str, found: Any) -> None:
        runs.setdefault(load, {}).setdefault(subject, []).append(found)
        logger.warning("prefix: %s, %s: %s", load, subject, _short(found))

    with servers.running(list(started.values())):
        for server in started.values():
            if server_cores:
                pin(server, server_cores)  # measured on the servers' core, alone
        for repeat in range(options.repeats):
            seed = 1000 * (repeat + 1)
            for load, workload in (
                (SYSTEM_CAPACITY, SYSTEM_PROMPTS),
                (UNIQUE_CAPACITY, UNIQUE),
                (HOT_CAPACITY, HOT),
            ):
                for subject in rotated(SUBJECTS, repeat):
                    stream = jobs(workload, shape, vocabulary, seed)
                    outcomes = uvloop.run(
                        client.closed_loop(started[subject].url, stream, options.clients, window[1])
                    )
                    keep(load, subject, figures(outcomes, *window))
            # The time to first token at a rate the replica without the cache sustains.
            rate = options.latency_share * runs[SYSTEM_CAPACITY][UNCACHED][-1].rps
            rates.setdefault(SYSTEM_LATENCY, []).append(rate)
            dues = poisson(0.0, window[1], rate, random.Random(seed + 1))
            requests = timed(SYSTEM_PROMPTS, shape, vocabulary, seed + 2, dues)
            for subject in rotated(SUBJECTS, repeat):
                outcomes = uvloop.run(client.open_loop(started[subject].url, requests))
                keep(SYSTEM_LATENCY, subject, figures([o for o in outcomes if o.due_s >= window[0]]))
            talks = conversations(tokenizer, shape, options.conversations, seed + 3)
            # They begin over the first second or so, as users do, not all in one instant.
            begun = [(index * 2 * options.think_s / len(talks), talk) for index, talk in enumerate(talks)]
            for subject in rotated(SUBJECTS, repeat):
                outcomes = uvloop.run(
                    client.conversations(
                        started[subject].url, begun, shape.new_tokens, options.think_s, seed + 4
                    )
                )
                keep(CONVERSATION_TURNS, subject, figures(outcomes, turn_from=FROM_TURN))
            for server in started.values():
                server.check_alive()
    setup = (
        f"one replica at a time on {_cores(server_cores)}, torch threads {options.threads}, max_batch_size "
        f"{options.max_batch_size}; prefix_cache_bytes {options.prefix_cache_bytes >> 20} MiB against 0; "
        f"{options.repeats} repeat(s) of {options.duration_s:g} s after {options.warmup_s:g} s of warm-up; "
        f"closed loops of {options.clients} clients; the system prompts' open loop at "
        f"{options.latency_share:g} of the capacity without the cache; {options.conversations} conversations "
        f"of {shape.turns} turns, a pause of {options.think_s:g} s on average after each answer, "
        f"the time to first token from turn {FROM_TURN} on"
    )
    return Part(setup, runs, replica_goals(runs), {load: median(values) for load, values in rates.items()})


def _cores(cores: set[int] | None) -> str:
    if not cores:
        return f"the machine's {len(os.sched_getaffinity(0))} cores, shared with the load"
    return f"core {','.join(map(str, sorted(cores)))}, the load on the others"


def _short(found: Any) -> str:
    return (
        f"{found.rps:.2f} req/s, {found.tokens_per_s:.0f} tokens/s, TTFT p50 {found.ttft_p50_ms:.0f} ms "
        f"p90 {found.ttft_p90_ms:.0f} ms, hit rate {found.hit_rate:.2f}, {found.errors} errors"
    )
