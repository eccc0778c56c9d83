"""Token-level vs request-level batching of text generation, in the same run, on the same prompts.

    python -m batchd.bench.generation [--quick] [--models tiny larger] [--repeats 3]

For each model (the tiny GPT-2, and a larger GPT-2 configuration, both built here with random
weights and 512 positions) two real replicas (`batchd serve`) run side by side, identical but for
`model.generation.scheduling`: `token` and `request`, both with max_batch_size 16. A mixed workload
arrives open loop (Poisson arrivals at a fixed rate, whatever the answers do): prompts of 4-64
tokens, max_new_tokens drawn from 8..256, greedy, min_new_tokens = max_new_tokens, so that both
modes make exactly the same tokens for the same prompts. Every request streams
(`generate_stream`): the time to first token is when its first event arrives (request-level
batching sends the whole answer as one event). Latencies count from when a request was due.

Per (model, mode, rate): output tokens/s (tokens of all requests over first arrival to last
answer), p50/p99 time to first token, p99 end-to-end latency. The modes take turns at every rate
of every repeat (which goes first alternates), and medians over repeats are reported, with the
rate at which request-level batching saturates (it completes under 90% of the offered tokens/s)
and the two ratios the issue asks for there. Writes bench/results/generation.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from batchd.bench import RESULTS_DIR, records
from batchd.bench.stats import median, percentile
from batchd.testing import manifests, servers
from batchd.testing.models import GPT2_CORPUS, build_gpt2

logger = logging.getLogger("batchd.bench.generation")

MODES = ("token", "request")
MAX_BATCH_SIZE = 16
PROMPT_TOKENS = (4, 64)
NEW_TOKENS = (8, 256)
SATURATED = 0.9  # completing under this share of the offered tokens/s: saturated


@dataclass(frozen=True)
class ModelSetup:
    title: str
    config: dict[str, int]  # GPT-2 configuration over batchd.testing.models.TINY_GPT2
    rates: tuple[float, ...]  # requests/s
    duration_s: float  # of arrivals, per run


MODELS: dict[str, ModelSetup] = {
    "tiny": ModelSetup(
        "tiny GPT-2 (4 layers x 256, 3.4M parameters)", {"n_positions": 512}, (2, 4, 6, 8, 12, 16), 15
    ),
    "larger": ModelSetup(
        "larger GPT-2 (6 layers x 512, 19.4M parameters)",
        {"n_layer": 6, "n_embd": 512, "n_head": 8, "n_positions": 512},
        (0.5, 1, 1.5, 2, 3),
        30,
    ),
}
QUICK: dict[str, ModelSetup] = {
    "tiny": ModelSetup(MODELS["tiny"].title, MODELS["tiny"].config, (4, 16), 4),
    "larger": ModelSetup(MODELS["larger"].title, MODELS["larger"].config, (1,), 6),
}


@dataclass(frozen=True)
class Job:
    due_s: float  # from the start of the run
    prompt: str
    prompt_tokens: int
    new_tokens: int


@dataclass(frozen=True)
class Outcome:
    due_s: float
    first_s: float | None  # when its first event arrived
    done_s: float | None  # when its last event arrived
    tokens: int
    error: str | None = None


# -- the workload -----------------------------------------------------------------------------------


def prompts(tokenizer: Any, count: int, rng: random.Random) -> list[tuple[str, int]]:
    """`count` prompts of 4-64 tokens (drawn uniformly), from the corpus the tokenizer learned."""
    words = " ".join(GPT2_CORPUS).split()
    made: list[tuple[str, int]] = []
    while len(made) < count:
        target = rng.randint(*PROMPT_TOKENS)
        text, length = "", 0
        while length < target:
            text = f"{text} {rng.choice(words)}".strip()
            length = len(tokenizer(text)["input_ids"])
        if length <= PROMPT_TOKENS[1]:
            made.append((text, length))
    return made


def workload(
    tokenizer: Any, rate: float, duration_s: float, seed: int, pool: list[tuple[str, int]] | None = None
) -> list[Job]:
    """Poisson arrivals at `rate` for `duration_s`; each with a prompt and a length of its own."""
    rng = random.Random(seed)
    arrivals = []
    due = rng.expovariate(rate)
    while due < duration_s:
        arrivals.append(due)
        due += rng.expovariate(rate)
    pool = pool or prompts(tokenizer, 200, random.Random(seed + 1))
    return [Job(t, *rng.choice(pool), rng.randint(*NEW_TOKENS)) for t in arrivals]


# -- one run ------------------------------------------------------------------------------------------


async def _one(session: aiohttp.ClientSession, url: str, job: Job, start: float) -> Outcome:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start + job.due_s - loop.time()))
    body = {
        "text_input": job.prompt,
        "parameters": {"temperature": 0, "max_tokens": job.new_tokens, "min_new_tokens": job.new_tokens},
    }
    first = done = None
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                return Outcome(
                    job.due_s, None, None, 0, f"{response.status}: {(await response.text())[:200]}"
                )
            tail = b""
            async for data in response.content.iter_any():
                if first is None:
                    first = loop.time() - start
                tail = (tail + data)[-4096:]
            done = loop.time() - start
    except (aiohttp.ClientError, TimeoutError) as error:
        return Outcome(job.due_s, first, None, 0, f"{type(error).__name__}: {error}")
    last = json.loads(tail.rstrip().rsplit(b"data: ", 1)[-1])
    if "error" in last or not last.get("done"):
        return Outcome(job.due_s, first, None, 0, str(last)[:200])
    return Outcome(job.due_s, first, done, int(last["generated_tokens"]))


async def run_point(url: str, model: str, jobs: Sequence[Job], give_up_s: float) -> list[Outcome]:
    """Every job at its due time, streamed; whatever is unanswered after `give_up_s` fails."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=give_up_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = asyncio.get_running_loop().time() + 0.2
        path = f"{url}/v2/models/{model}/generate_stream"
        return list(await asyncio.gather(*(_one(session, path, job, start) for job in jobs)))


def summarise(
    jobs: Sequence[Job], outcomes: Sequence[Outcome], rate: float, duration_s: float
) -> dict[str, Any]:
    answered = [(o, o.first_s, o.done_s) for o in outcomes if o.error is None]
    ok = [(o, first, done) for o, first, done in answered if first is not None and done is not None]
    tokens = sum(o.tokens for o, _, _ in ok)
    span = max(done for _, _, done in ok) - min(o.due_s for o in outcomes) if ok else math.nan
    return {
        "rate_rps": rate,
        "requests": len(outcomes),
        "completed": len(ok),
        "errors": len(outcomes) - len(ok),
        "error_samples": [o.error for o in outcomes if o.error][:3],
        "output_tokens": tokens,
        "tokens_per_s": tokens / span if ok and span > 0 else math.nan,
        "offered_tokens_per_s": sum(job.new_tokens for job in jobs) / duration_s,
        "ttft_p50_ms": percentile([first - o.due_s for o, first, _ in ok], 50) * 1000,
        "ttft_p99_ms": percentile([first - o.due_s for o, first, _ in ok], 99) * 1000,
        "e2e_p50_ms": percentile([done - o.due_s for o, _, done in ok], 50) * 1000,
        "e2e_p99_ms": percentile([done - o.due_s for o, _, done in ok], 99) * 1000,
    }


# -- the benchmark ------------------------------------------------------------------------------------


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
    return manifests.manifest(name, model, batching=batching)


def run_model(
    key: str, setup: ModelSetup, repeats: int, workdir: Path, threads: int, device: str = "cpu"
) -> dict[str, Any]:
    from transformers import AutoTokenizer

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
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {mode: {} for mode in MODES}
    with servers.running(list(started.values())):
        for repeat in range(repeats):
            for index, rate in enumerate(setup.rates):
                # The same arrivals and prompts for both modes; new ones every repeat.
                jobs = workload(tokenizer, rate, setup.duration_s, seed=1000 * repeat + index, pool=pool)
                order = MODES if (repeat + index) % 2 == 0 else MODES[::-1]
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
                    if summary["errors"]:
                        logger.warning(
                            "[%s] %s: %d errors, e.g. %s",
                            key,
                            mode,
                            summary["errors"],
                            summary["error_samples"],
                        )
                    runs[mode].setdefault(str(rate), []).append(summary)
    medians = {
        mode: [{"rate_rps": float(rate), **_medians(per_rate)} for rate, per_rate in runs[mode].items()]
        for mode in MODES
    }
    return {
        "title": setup.title,
        "config": setup.config,
        "rates_rps": list(setup.rates),
        "duration_s": setup.duration_s,
        "repeats": repeats,
        "torch_threads": threads,
        "medians": medians,
        "comparison": compare(medians),
        "runs": runs,
    }


def _medians(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    keys = ("tokens_per_s", "offered_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
    result: dict[str, Any] = {key: median([s[key] for s in summaries]) for key in keys}
    result["errors"] = sum(s["errors"] for s in summaries)
    result["requests"] = sum(s["requests"] for s in summaries)
    return result


def compare(medians: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Where request-level batching saturates, and token- over request-level there."""
    request = medians["request"]
    token = {point["rate_rps"]: point for point in medians["token"]}
    saturated = [p for p in request if p["tokens_per_s"] < SATURATED * p["offered_tokens_per_s"]]
    at = saturated[0] if saturated else request[-1]
    other = token[at["rate_rps"]]
    return {
        "request_level_saturates_at_rps": at["rate_rps"] if saturated else None,
        "compared_at_rps": at["rate_rps"],
        "throughput_ratio": other["tokens_per_s"] / at["tokens_per_s"],
        "ttft_p99_ratio": at["ttft_p99_ms"] / other["ttft_p99_ms"],
        "e2e_p99_ratio": at["e2e_p99_ms"] / other["e2e_p99_ms"],
        "best_tokens_per_s": {mode: max(p["tokens_per_s"] for p in medians[mode]) for mode in MODES},
    }


# -- the report ---------------------------------------------------------------------------------------


def _n(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


TABLE_HEAD = (
    "| rate req/s | mode | output tokens/s | offered tokens/s | TTFT p50 ms | TTFT p99 ms "
    "| end-to-end p99 ms | errors |\n|---:|---|---:|---:|---:|---:|---:|---:|"
)


def _row(point: dict[str, Any], mode: str) -> str:
    cells = [
        f"{point['rate_rps']:g}",
        mode,
        *(_n(point[key]) for key in ("tokens_per_s", "offered_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms")),
        _n(point["e2e_p99_ms"]),
        str(point["errors"]),
    ]
    return "| " + " | ".join(cells) + " |"


def verdict(comparison: dict[str, Any]) -> str:
    """The sentence the README quotes: the two ratios where request-level batching saturates."""
    where = comparison["request_level_saturates_at_rps"]
    if where is not None:
        lead = (
            f"Request-level batching saturates at {where:g} req/s (it completes under {SATURATED:.0%} of "
            "the offered tokens/s). There, token-level batching makes"
        )
    else:
        lead = (
            "Request-level batching did not saturate; at the highest rate, "
            f"{comparison['compared_at_rps']:g} req/s, token-level batching makes"
        )
    best = comparison["best_tokens_per_s"]
    return (
        f"{lead} **{comparison['throughput_ratio']:.2f}x** the output tokens/s, with a "
        f"**{comparison['ttft_p99_ratio']:.1f}x** lower p99 time to first token and a "
        f"{comparison['e2e_p99_ratio']:.1f}x lower p99 end-to-end latency. Best output tokens/s: "
        f"token-level {_n(best['token'])}, request-level {_n(best['request'])}."
    )


def to_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# Text generation: token-level vs request-level batching",
        "",
        f"`{meta['command']}` ({meta['date']}, {meta['machine']}; device {meta.get('device', 'cpu')}). "
        "Open loop, Poisson "
        f"arrivals; prompts of {PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} tokens, max_new_tokens "
        f"{NEW_TOKENS[0]}..{NEW_TOKENS[1]} (= min_new_tokens, greedy: both modes make the same tokens); "
        f"max_batch_size {MAX_BATCH_SIZE}; every request streamed. Medians over repeats; the modes take "
        "turns at every rate.",
        "",
    ]
    for model in results["models"].values():
        lines += [
            f"## {model['title']}",
            "",
            f"{model['repeats']} repeat(s) of {model['duration_s']:g} s of arrivals per rate; "
            f"{model['torch_threads']} torch thread(s) per replica.",
            "",
            TABLE_HEAD,
        ]
        for index in range(len(model["rates_rps"])):
            lines += [_row(model["medians"][mode][index], mode) for mode in MODES]
        lines += ["", verdict(model["comparison"]), ""]
    lines.append("![throughput and p99 time to first token against arrival rate](generation.png)\n")
    return "\n".join(lines)


def draw_chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = results["models"]
    figure, axes = plt.subplots(
        2, len(models), figsize=(6 * len(models), 8), squeeze=False, constrained_layout=True
    )
    colors = {"token": "tab:blue", "request": "tab:orange"}
    for column, model in enumerate(models.values()):
        throughput, ttft = axes[0][column], axes[1][column]
        for mode in MODES:
            points = model["medians"][mode]
            rates = [p["rate_rps"] for p in points]
            label = f"{mode}-level"
            throughput.plot(rates, [p["tokens_per_s"] for p in points], "o-", color=colors[mode], label=label)
            ttft.plot(rates, [p["ttft_p99_ms"] for p in points], "o-", color=colors[mode], label=label)
            for run_rate, per_rate in model["runs"][mode].items():  # each repeat, faintly
                throughput.plot(
                    [float(run_rate)] * len(per_rate),
                    [r["tokens_per_s"] for r in per_rate],
                    ".",
                    color=colors[mode],
                    alpha=0.3,
                )
        offered = [p["offered_tokens_per_s"] for p in model["medians"]["token"]]
        throughput.plot(
            [p["rate_rps"] for p in model["medians"]["token"]], offered, ":", color="grey", label="offered"
        )
        throughput.set_title(f"{model['title']}: output tokens/s")
        ttft.set_title("p99 time to first token (ms, log)")
        ttft.set_yscale("log")
        ttft.set_xlabel("arrival rate (requests/s)")
        for ax in (throughput, ttft):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    title = f"Token- vs request-level batching, max_batch_size {MAX_BATCH_SIZE}, medians of repeats"
    figure.suptitle(f"{title} ({results['meta']['date']})", fontsize=10)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m batchd.bench.generation", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="smoke-sized: few rates, short runs, one repeat")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS, reverse=True))
    parser.add_argument(
        "--repeats", type=int, default=None, help="interleaved repeats (default 3; 1 with --quick)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of both replicas (OMP_NUM_THREADS; default 1: on 2 shared cores, one intra-op "
        "thread beside the load generator was faster for both modes)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where both replicas run the model (cuda: results go to generation-cuda.{json,md,png})",
    )
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="models and logs (default: a temporary folder)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    setups = QUICK if args.quick else MODELS
    repeats = args.repeats or (1 if args.quick else 3)
    meta = {
        **records.run_meta("batchd.bench.generation", argv),
        "device": args.device,
    }
    with tempfile.TemporaryDirectory(prefix="batchd-generation-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        results = {
            "meta": meta,
            "models": {
                key: run_model(key, setups[key], repeats, workdir, args.threads, args.device)
                for key in args.models
            },
        }
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = "generation" if args.device == "cpu" else f"generation-{args.device}"
    records.write_json(args.output_dir / f"{stem}.json", results)
    (args.output_dir / f"{stem}.md").write_text(to_markdown(results))
    draw_chart(results, args.output_dir / f"{stem}.png")
    print(to_markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
