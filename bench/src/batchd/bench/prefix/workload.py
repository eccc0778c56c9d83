"""What the prefix benchmark sends: its options, its model, and the four workloads as requests.

Prompts are token ids (`/v1/completions` takes them), so that their lengths are exact; the
conversations are text (the chat route renders them with the spec's template). Every workload is
drawn from a seed: each subject of a repeat gets the same requests, and each repeat new ones, so
that no run finds what an earlier run left in a cache.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchd.testing.models import GPT2_CORPUS

MODEL = "gpt2"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
# The tiny GPT-2 of the tests, its context raised so that a system prompt, a question and an answer fit.
GPT2_CONFIG = {"n_positions": 1024}
BLOCK_TOKENS = 16
# The workloads of single prompts, by name (`jobs`, `timed`); conversations have their own
# (`conversations`, `endless_conversations`).
SYSTEM_PROMPTS = "system prompts"
UNIQUE = "unique prompts"
HOT = "one hot prefix"
PARTS = ("replica", "routing", "peers")


@dataclass(frozen=True)
class Shape:
    """The sizes of the prompts and answers, in tokens."""

    system_tokens: int = 768
    question_tokens: tuple[int, int] = (32, 64)
    new_tokens: int = 32
    system_prompts: int = 8
    # Conversations: a system prompt of their own, questions as above, answers of new_tokens.
    conversation_system_tokens: int = 256
    turns: int = 6


@dataclass(frozen=True)
class Options:
    parts: tuple[str, ...] = PARTS
    repeats: int = 3
    duration_s: float = 20.0  # each measured loop
    warmup_s: float = 4.0  # the same load first, not counted
    clients: int = 32  # the closed loops': two batches of a replica's
    max_batch_size: int = 16
    prefix_cache_bytes: int = 512 << 20  # the replica part's cache: every workload fits
    latency_share: float = 0.5  # the system prompts' open loop: this share of the uncached capacity
    conversations: int = 16  # the replica part's, all at once
    think_s: float = 0.5  # a conversation's pause between an answer and its next question (mean)
    # Routing: conversations arrive open loop at this share of the power-of-two capacity, each
    # replica's cache holding about half of what they hold together.
    routing_share: float = 0.7
    routing_cache_bytes: int = 48 << 20
    routing_think_s: float = 2.0  # longer pauses: more conversations under way at once
    routing_conversations: int = 32  # the capacity's closed loop: conversations at once
    threads: int = 1  # torch threads of every replica
    # The routing part's API server starts beside the replica part (the smoke's: its figures need
    # no quiet machine), not after it.
    early_control_plane: bool = False
    # Peers: the peers benchmark's tiny GPT-2 load, with batchd's cache on and off.
    peers: tuple[str, ...] = ("batchd", "uncached", "pytriton", "mosec", "litserve", "bentoml", "ray")
    peer_repeats: int = 3
    peer_duration_s: float = 20.0
    shape: Shape = field(default_factory=Shape)


# Smoke-sized: every load and part, each loop a second and a half (dozens of answers of a handful of
# tokens; the warm-up holds each client's first, cold, answer even on a busy machine).
QUICK = Options(
    repeats=1,
    duration_s=1.0,
    warmup_s=0.5,
    clients=4,
    max_batch_size=4,
    conversations=3,
    think_s=0.05,
    routing_conversations=4,
    routing_think_s=0.05,
    peers=("batchd", "uncached"),
    peer_repeats=1,
    peer_duration_s=1.0,
    early_control_plane=True,
    shape=Shape(system_tokens=64, question_tokens=(8, 16), new_tokens=4, system_prompts=2,
                conversation_system_tokens=32, turns=3),
)  # fmt: skip


@dataclass(frozen=True)
class Job:
    """One request: its route and body (streamed on sending), and its turn in a conversation (0: none)."""

    path: str
    body: dict[str, Any]
    new_tokens: int
    turn: int = 0


def completion(prompt: Sequence[int], new_tokens: int) -> Job:
    body = {"model": MODEL, "prompt": list(prompt), "max_tokens": new_tokens, "temperature": 0}
    return Job(COMPLETIONS, body, new_tokens)


def ids(rng: random.Random, count: int, vocabulary: int) -> list[int]:
    return [rng.randrange(1, vocabulary) for _ in range(count)]


def question(rng: random.Random, shape: Shape, vocabulary: int) -> list[int]:
    return ids(rng, rng.randint(*shape.question_tokens), vocabulary)


def jobs(workload: str, shape: Shape, vocabulary: int, seed: int) -> Iterator[Job]:
    """An endless stream of one workload's requests (not the conversations: `conversation`)."""
    rng = random.Random(seed)
    if workload == UNIQUE:
        length = shape.system_tokens + sum(shape.question_tokens) // 2
        while True:
            yield completion(ids(rng, length, vocabulary), shape.new_tokens)
    count = shape.system_prompts if workload == SYSTEM_PROMPTS else 1
    systems = [ids(rng, shape.system_tokens, vocabulary) for _ in range(count)]
    while True:
        yield completion(rng.choice(systems) + question(rng, shape, vocabulary), shape.new_tokens)


def timed(
    workload: str, shape: Shape, vocabulary: int, seed: int, dues: Sequence[float]
) -> list[tuple[float, Job]]:
    """One request of the workload at each due time."""
    return list(zip(dues, itertools.islice(jobs(workload, shape, vocabulary, seed), len(dues)), strict=True))


@dataclass(frozen=True)
class Conversation:
    """A system prompt and the user's questions, one a turn (the answers come from the model)."""

    system: str
    questions: tuple[str, ...]

    def messages(self, answers: Sequence[str]) -> list[dict[str, str]]:
        """The conversation up to the next question: every earlier question and its answer."""
        messages = [{"role": "system", "content": self.system}]
        for turn, answer in enumerate(answers):
            messages += [
                {"role": "user", "content": self.questions[turn]},
                {"role": "assistant", "content": answer},
            ]
        return [*messages, {"role": "user", "content": self.questions[len(answers)]}]

    def job(self, answers: Sequence[str], new_tokens: int) -> Job:
        body = {
            "model": MODEL,
            "messages": self.messages(answers),
            "max_tokens": new_tokens,
            "temperature": 0,
        }
        return Job(CHAT, body, new_tokens, turn=len(answers) + 1)


def text_of(tokenizer: Any, rng: random.Random, tokens: int) -> str:
    """Words of the corpus the tokenizer learned, to about `tokens` tokens."""
    words = " ".join(GPT2_CORPUS).split()
    text, length = "", 0
    while length < tokens:
        text = f"{text} {rng.choice(words)}".strip()
        length = len(tokenizer(text)["input_ids"])
    return text


def endless_conversations(tokenizer: Any, shape: Shape, seed: int) -> Iterator[Conversation]:
    """New conversations, one after another, each of its own seed."""
    for n in itertools.count():
        yield from conversations(tokenizer, shape, 1, seed * 100_000 + n)


def conversations(tokenizer: Any, shape: Shape, count: int, seed: int) -> list[Conversation]:
    """`count` conversations, each with a system prompt of its own."""
    rng = random.Random(seed)
    return [
        Conversation(
            f"Conversation {seed}-{n}. " + text_of(tokenizer, rng, shape.conversation_system_tokens),
            tuple(text_of(tokenizer, rng, rng.randint(*shape.question_tokens)) for _ in range(shape.turns)),
        )
        for n in range(count)
    ]
