"""What the OpenAI benchmark sends: the two parts' routes, request bodies and client counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from batchd.testing.models import MINILM_SOURCE, SENTENCE

EMBEDDINGS_MODEL = "minilm"
CHAT_MODEL = "gpt2"
NEW_TOKENS = 64  # every streamed answer: exactly this many tokens
PROMPT = "Once upon a time there was a batching server that gathered requests into batches."
# The chat template writes the last message alone: the chat route runs generate_stream's prompt.
CHAT_TEMPLATE = "{{ messages[-1]['content'] }}"
GOAL_SHARE = 0.95  # the OpenAI route's figure over the other route's, at least (within 5%)


@dataclass(frozen=True)
class Route:
    """One route a part compares: its label in the report, path and body."""

    label: str
    path: str
    body: bytes


@dataclass(frozen=True)
class Setup:
    clients: tuple[int, ...]  # on each route, both routes at once
    duration_s: float  # measured, per client count
    warmup_s: float


EMBEDDING_ROUTES = (
    Route(
        "openai",
        "/v1/embeddings",
        orjson.dumps({"model": EMBEDDINGS_MODEL, "input": SENTENCE, "encoding_format": "float"}),
    ),
    Route("kserve_v1", f"/v1/models/{EMBEDDINGS_MODEL}:predict", orjson.dumps({"instances": [SENTENCE]})),
)
STREAMING_ROUTES = (
    Route(
        "openai",
        "/v1/chat/completions",
        orjson.dumps(
            {
                "model": CHAT_MODEL,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": NEW_TOKENS,
                "temperature": 0,
                "stream": True,
            }
        ),
    ),
    Route(
        "oip_generate_stream",
        f"/v2/models/{CHAT_MODEL}/generate_stream",
        orjson.dumps({"text_input": PROMPT, "parameters": {"max_tokens": NEW_TOKENS, "temperature": 0}}),
    ),
)

EMBEDDINGS = Setup(clients=(1, 8, 32, 64), duration_s=6.0, warmup_s=1.0)
# Clients on each route, both routes at once: 16 streams in all at most, the replica's rows
# (CHAT_BATCHING), so that no stream waits for a row and a first token is a prefill's time.
STREAMING = Setup(clients=(1, 4, 8), duration_s=10.0, warmup_s=1.0)
PARTS = ("embeddings", "streaming")


@dataclass(frozen=True)
class Options:
    parts: tuple[str, ...] = PARTS
    repeats: int = 5  # both routes at once in each
    threads: int = 1  # torch threads per replica (OMP_NUM_THREADS), as the other benchmarks
    embeddings: Setup = EMBEDDINGS
    streaming: Setup = STREAMING


# Smoke-sized, yet long enough that each route answers twice in a window (a rate needs two answers)
# on a starved machine, where one second at one client may hold a single answer.
QUICK = Options(repeats=1, embeddings=Setup((1, 8), 3.0, 0.3), streaming=Setup((1, 4), 2.0, 0.3))


EMBEDDINGS_MODEL_SPEC = {
    "name": EMBEDDINGS_MODEL,
    "task": "feature-extraction",
    "source": MINILM_SOURCE,
    "device": "cpu",
}
EMBEDDINGS_BATCHING = {"max_batch_size": 32, "batch_wait_timeout_s": 0.002, "max_queued_requests": 1024}


def chat_model(model_dir: str) -> dict[str, Any]:
    return {
        "name": CHAT_MODEL,
        "task": "text-generation",
        "source": f"file://{model_dir}",
        "device": "cpu",
        # Every answer runs to max_tokens: both routes make the same tokens.
        "call_kwargs": {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS},
        "generation": {"max_new_tokens": NEW_TOKENS, "chat_template": CHAT_TEMPLATE},
    }


CHAT_BATCHING = {"max_batch_size": 16, "max_queued_requests": 1024, "request_timeout_s": 300}
