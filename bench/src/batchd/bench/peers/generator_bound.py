"""The generator's bound: batchd's engine on the peers' GPT-2 load with no server in the way, beside
what every peer runs behind its server (`models.load_generator`: transformers' `generate` over a
batch of prompts), in one process on one core, taking turns.

Served, a peer that batches whole requests makes at most what `generate` makes of full batches,
and batchd at most what its engine makes of the same sequences all joined at once: the ratio of
the two is the most batchd could be ahead on this load, whatever its server did. What a served
run loses beside it is the server's: sequences that join one by one (a prefill each) and the
HTTP front on the same core.

    python -m batchd.bench.peers.generator_bound --repeats 9
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from batchd.bench.kit.peer_servers.catalog import PROMPT
from batchd.bench.kit.peer_servers.servers import models
from batchd.bench.kit.stats import median
from batchd.testing.models import build_gpt2


def engine_runner(directory: Path, rows: int, tokens: int) -> Callable[[], list[str]]:
    """One run of batchd's engine over `rows` copies of the peers' prompt, each to `tokens` tokens
    (greedy, as the peers' answers), on this thread: the answers' texts. Torch's threads are as
    `load_generator` set them, the same for both."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from batchd.replica.generation.engine import GenerationEngine
    from batchd.replica.generation.params import GenerationParams, GenerationRequest

    encoder, decoder = AutoTokenizer.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="sdpa")
    model.eval()  # type: ignore[no-untyped-call]
    params = GenerationParams(max_new_tokens=tokens, min_new_tokens=tokens)
    eos = encoder.eos_token_id

    def run() -> list[str]:
        engine = GenerationEngine(
            model,
            decoder,
            eos_ids=[eos],
            special_ids=frozenset(encoder.all_special_ids),
            pad_id=encoder.pad_token_id,
            context_tokens=model.config.n_positions,
            max_running=rows,
        )
        ids = tuple(encoder(PROMPT)["input_ids"])
        answers = engine.run_to_completion([GenerationRequest(PROMPT, ids, params) for _ in range(rows)])
        return ["".join(chunk.text for chunk in chunks) for chunks in answers]

    return run


def measure(directory: Path, repeats: int, rows: int) -> dict[str, object]:
    """Seconds of each subject per repeat, in turns, and the medians of tokens/s and of the
    per-repeat ratio; every answer is the peers' NEW_TOKENS tokens, and the two subjects' answers
    are checked equal first (which also warms both up)."""
    tokens = models.NEW_TOKENS
    generate = models.load_generator(str(directory))
    subjects: dict[str, Callable[[], list[str]]] = {
        "generate": lambda: generate([PROMPT] * rows),
        "engine": engine_runner(directory, rows, tokens),
    }
    answers = {name: run() for name, run in subjects.items()}
    if answers["engine"] != answers["generate"]:  # a bound between different work says nothing
        raise AssertionError(f"the engine's answers differ from generate's: {answers}")
    seconds: dict[str, list[float]] = {name: [] for name in subjects}
    for _ in range(repeats):
        for name, run in subjects.items():
            started = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - started)
    made = rows * tokens
    return {
        "rows": rows,
        "tokens": tokens,
        "repeats": repeats,
        "tokens_per_s": {name: made / median(values) for name, values in seconds.items()},
        "engine_over_generate": median(
            [g / e for g, e in zip(seconds["generate"], seconds["engine"], strict=True)]
        ),
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rows", type=int, default=models.MAX_BATCH_SIZE, help="the peers' batch")
    parser.add_argument("--core", type=int, default=0, help="the one core to run on (as a served replica)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.core})
    os.environ[models.DEVICE_VARIABLE] = "cpu"
    with tempfile.TemporaryDirectory(prefix="batchd-generator-bound-") as workdir:
        directory = build_gpt2(Path(workdir) / "gpt2-tiny")
        found = measure(directory, args.repeats, args.rows)
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
