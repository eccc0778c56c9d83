"""Running the workload: two replicas side by side, streamed requests, every rate of every repeat."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from batchd.bench.generation.analysis import ModelResult, RunSummary, compare, medians_over_repeats, summarise
from batchd.bench.generation.workload import (
    MAX_BATCH_SIZE,
    MODES,
    NEW_TOKENS,
    Job,
    Options,
    Outcome,
    prompts,
    workload,
)
from batchd.bench.kit import streams
from batchd.bench.kit.repeats import rotated
from batchd.testing import servers
from batchd.testing.manifests import manifest
from batchd.testing.models import build_gpt2

logger = logging.getLogger("batchd.bench.generation")


async def _one(session: aiohttp.ClientSession, url: str, job: Job, start: float) -> Outcome:
    body = {
        "text_input": job.prompt,
        "parameters": {"temperature": 0, "max_tokens": job.new_tokens, "min_new_tokens": job.new_tokens},
    }
    answer = await streams.stream(session, url, body)
    first = None if answer.first_s is None else answer.first_s - start
    if answer.done_s is None:
        return Outcome(job.due_s, first, None, 0, answer.error)
    last = json.loads(answer.last)
    if "error" in last or not last.get("done"):
        return Outcome(job.due_s, first, None, 0, str(last)[:200])
    return Outcome(job.due_s, first, answer.done_s - start, int(last["generated_tokens"]))


async def run_point(url: str, model: str, jobs: Sequence[Job], give_up_s: float) -> list[Outcome]:
    """Every job at its due time, streamed; whatever is unanswered after `give_up_s` fails."""
    path = f"{url}/v2/models/{model}/generate_stream"
    async with streams.session(give_up_s) as session:
        timed = [(job.due_s, job) for job in jobs]
        return await streams.open_loop(
            timed, lambda start, _, job: _one(session, path, job, start), lead_s=0.2
        )


def replica_manifest(name: str, model_dir: Path, mode: str, device: str = "cpu") -> dict[str, Any]:
    model = {
        "name": "gpt2",
        "task": "text-generation",
        "source": f"file://{model_dir}",
        "device": device,
        "generation": {"scheduling": mode, "max_new_tokens": NEW_TOKENS[1]},
    }
    batching = {
        "max_batch_size": MAX_BATCH_SIZE,
        "batch_wait_timeout_s": 0.01,
        "max_queued_requests": 4096,
        "request_timeout_s": 900,
    }
    return manifest(name, model, batching=batching)


def run_model(key: str, options: Options, workdir: Path) -> ModelResult:
    from transformers import AutoTokenizer

    setup, repeats, threads, device = options.setups[key], options.repeats, options.threads, options.device
    model_dir = workdir / f"gpt2-{key}"
    if not (model_dir / "config.json").exists():
        build_gpt2(model_dir, **setup.config)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pool = prompts(tokenizer, 200, random.Random(7))
    started = {
        mode: servers.start_replica(
            servers.write_manifest(workdir, replica_manifest(f"{key}-{mode}", model_dir, mode, device)),
            workdir / "logs",
            env={"OMP_NUM_THREADS": str(threads)},
        )
        for mode in MODES
    }
    runs: dict[str, dict[str, list[RunSummary]]] = {mode: {} for mode in MODES}
    with servers.running(list(started.values())):
        for repeat in range(repeats):
            for index, rate in enumerate(setup.rates):
                # The same arrivals and prompts for both modes; new ones every repeat.
                jobs = workload(tokenizer, rate, setup.duration_s, seed=1000 * repeat + index, pool=pool)
                order = rotated(MODES, repeat + index)
                for mode in order:
                    server = started[mode]
                    logger.info(
                        "[%s] repeat %d, %s-level, %g req/s: %d requests",
                        key,
                        repeat + 1,
                        mode,
                        rate,
                        len(jobs),
                    )
                    outcomes = uvloop.run(run_point(server.url, "gpt2", jobs, give_up_s=900))
                    server.check_alive()
                    summary = summarise(jobs, outcomes, rate, setup.duration_s)
                    if summary.errors:
                        logger.warning(
                            "[%s] %s: %d errors, e.g. %s", key, mode, summary.errors, summary.error_samples
                        )
                    runs[mode].setdefault(str(rate), []).append(summary)
    medians = {
        mode: [medians_over_repeats(float(rate), per_rate) for rate, per_rate in runs[mode].items()]
        for mode in MODES
    }
    return ModelResult(
        title=setup.title,
        config=setup.config,
        rates_rps=list(setup.rates),
        duration_s=setup.duration_s,
        repeats=repeats,
        torch_threads=threads,
        medians=medians,
        comparison=compare(medians),
        runs=runs,
    )
