"""What the generation benchmark sends: its models, and a mixed workload of prompts and lengths
arriving open loop."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from batchd.bench.kit.arrivals import poisson
from batchd.testing.models import GPT2_CORPUS

MODES = ("token", "request")
MAX_BATCH_SIZE = 16
PROMPT_TOKENS = (4, 64)
NEW_TOKENS = (8, 256)
# The workload in the words of a report.
SHAPE = (
    f"prompts of {PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} tokens, "
    f"max_new_tokens {NEW_TOKENS[0]}..{NEW_TOKENS[1]} "
    "(= min_new_tokens, greedy: every token asked for is made)"
)


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


@dataclass(frozen=True)
class Options:
    models: tuple[str, ...] = tuple(MODELS)
    repeats: int = 3  # interleaved
    # Torch threads of both replicas (OMP_NUM_THREADS): on 2 shared cores, one intra-op thread beside
    # the load generator was faster for both modes.
    threads: int = 1
    device: str = "cpu"  # where both replicas run the model
    setups: Mapping[str, ModelSetup] = field(default_factory=lambda: MODELS)


QUICK = Options(
    repeats=1,
    setups={
        "tiny": ModelSetup(MODELS["tiny"].title, MODELS["tiny"].config, (4, 16), 4),
        "larger": ModelSetup(MODELS["larger"].title, MODELS["larger"].config, (1,), 6),
    },
)


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
    arrivals = poisson(0.0, duration_s, rate, rng)
    pool = pool or prompts(tokenizer, 200, random.Random(seed + 1))
    return [Job(t, *rng.choice(pool), rng.randint(*NEW_TOKENS)) for t in arrivals]
