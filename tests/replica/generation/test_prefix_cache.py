"""The prefix cache: exact (a prompt that begins with cached blocks gets the same greedy tokens as
without the cache, whatever the length of what it shares, around every block boundary), bounded
in bytes (least recently used blocks go, the tail of a prompt before its head; a prompt longer
than the cache fills it with blocks a match reaches), and salted (one caller's blocks are never
another's).

The engine runs the tiny GPT-2 in this process, on the test's thread (`run_to_completion`), as
the replica's warm-up does.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from batchd.api.priority import NO_CLASSES, PriorityClass
from batchd.api.spec import ModelSpec
from batchd.replica.generation.engine import GenerationEngine, SequenceState
from batchd.replica.generation.loader import TokenGenerationModel, load_text_generation
from batchd.replica.generation.params import Chunk, GenerationParams, GenerationRequest
from batchd.replica.generation.prefix_cache import (
    BLOCK_TOKENS,
    PrefixCache,
    default_capacity_bytes,
    extend_keys,
)
from batchd.replica.models.executor import ModelExecutor
from batchd.testing.models import build_gpt2

SECRET = b"0123456789abcdef"
NEW_TOKENS = 4
GREEDY = GenerationParams(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)


# -- the cache alone ---------------------------------------------------------------------------


def buffers(rows: int = 2, columns: int = 8 * BLOCK_TOKENS, layers: int = 2) -> list[tuple[Any, Any]]:
    """Running buffers as the engine's, [rows, heads, columns, head dim], with distinct values."""
    shape = (rows, 2, columns, 4)
    return [
        (torch.randn(shape, generator=torch.Generator().manual_seed(2 * layer)),
         torch.randn(shape, generator=torch.Generator().manual_seed(2 * layer + 1)))
        for layer in range(layers)
    ]  # fmt: skip


def tokens(count: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(count)]


def test_a_block_key_names_every_token_up_to_its_end_and_the_salt() -> None:
    ids = tokens(4 * BLOCK_TOKENS + 5)
    keys = extend_keys([], ids, "alice", SECRET)
    assert len(keys) == 4  # whole blocks only
    assert extend_keys([], ids[: 2 * BLOCK_TOKENS], "alice", SECRET) == keys[:2]
    changed = list(ids)
    changed[2 * BLOCK_TOKENS + 3] += 1  # a token of the third block
    other = extend_keys([], changed, "alice", SECRET)
    assert other[:2] == keys[:2] and not set(other[2:]) & set(keys)
    assert not set(extend_keys([], ids, "bob", SECRET)) & set(keys), "another caller's keys are all different"
    assert not set(extend_keys([], ids, "alice", b"another secret!!")) & set(keys)
    assert extend_keys(keys[:1], ids, "alice", SECRET) == keys, "keys extend where they stopped"


def test_blocks_come_back_as_they_were_stored() -> None:
    running = buffers()
    cache = PrefixCache(1 << 20, SECRET)
    keys = extend_keys([], tokens(3 * BLOCK_TOKENS), "", SECRET)
    cache.store(keys, 0, running)
    assert cache.blocks == 3 and cache.bytes_held == 3 * cache.block_bytes
    slots = cache.match(keys)
    assert len(slots) == 3
    for layer, (layer_keys, layer_values) in enumerate(running):
        cache.copy_to(layer, layer_keys, layer_values, [(1, slots)])
        span = slice(0, 3 * BLOCK_TOKENS)
        assert torch.equal(layer_keys[1, :, span], layer_keys[0, :, span])
        assert torch.equal(layer_values[1, :, span], layer_values[0, :, span])


def test_the_cache_holds_no_more_than_its_bound_and_evicts_the_least_recently_used() -> None:
    running = buffers(columns=4 * BLOCK_TOKENS)
    probe = PrefixCache(1 << 20, SECRET)
    probe.store(extend_keys([], tokens(BLOCK_TOKENS), "", SECRET), 0, running)
    cache = PrefixCache(6 * probe.block_bytes, SECRET)  # six blocks
    prompts = [extend_keys([], tokens(4 * BLOCK_TOKENS, seed), "", SECRET) for seed in range(3)]
    cache.store(prompts[0], 0, running)
    cache.store(prompts[1][:2], 0, running)
    assert cache.blocks == 6
    assert len(cache.match(prompts[0])) == 4  # the first prompt used again: the second is older now
    cache.store(prompts[2][:2], 0, running)
    assert cache.bytes_held <= cache.capacity_bytes
    assert cache.stats.evicted_blocks == 2
    assert len(cache.match(prompts[0])) == 4 and len(cache.match(prompts[2])) == 2
    assert cache.match(prompts[1]) == [], "the least recently used prompt went"
    cache.store(extend_keys([], tokens(4 * BLOCK_TOKENS, 9), "", SECRET)[:1], 0, running)
    # One more block evicts the tail of the least recently used prompt (the first), never its head.
    assert len(cache.match(prompts[0])) == 3
    cache.set_capacity(2 * cache.block_bytes)
    assert cache.blocks == 2 and cache.bytes_held == 2 * cache.block_bytes


def test_a_prompt_longer_than_the_cache_keeps_the_blocks_a_match_reaches() -> None:
    running = buffers(rows=1, columns=61 * BLOCK_TOKENS, layers=1)
    probe = PrefixCache(1 << 20, SECRET)
    probe.store(extend_keys([], tokens(BLOCK_TOKENS), "", SECRET), 0, running)
    cache = PrefixCache(48 * probe.block_bytes, SECRET)
    prompt = extend_keys([], tokens(60 * BLOCK_TOKENS), "", SECRET)
    cache.store(prompt, 0, running)  # as the prompt is prefilled
    cache.store(prompt + extend_keys(list(prompt), tokens(61 * BLOCK_TOKENS), "", SECRET)[60:], 0, running)
    # ... and as its sequence ends, one block longer: no block of its head makes room for its tail.
    assert len(cache.match(prompt)) == cache.blocks == 48
    assert cache.stats.evicted_blocks == 0 and cache.bytes_held == cache.capacity_bytes
    other = extend_keys([], tokens(2 * BLOCK_TOKENS, seed=1), "", SECRET)
    cache.store(other, 0, running)  # another prompt takes the long one's last blocks, not its first
    assert len(cache.match(prompt)) == cache.blocks - 2 == 46 and len(cache.match(other)) == 2


def test_the_default_bound_is_half_of_what_the_memory_request_leaves() -> None:
    gib = 1 << 30
    assert default_capacity_bytes(8 * gib, 1 * gib, 3 * gib) == 2 * gib
    assert default_capacity_bytes(1 * gib, 1 * gib, 3 * gib) == 0, "nothing left: no cache"
    assert default_capacity_bytes(None, 1 * gib, 3 * gib) == gib, "no request: a gibibyte"


# -- the engine, exact -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> TokenGenerationModel:
    # A context of 1,024 tokens: room for a prompt longer than a small cache.
    directory: Path = build_gpt2(tmp_path_factory.mktemp("tiny-gpt2"), n_positions=1024)
    spec = ModelSpec.model_validate(
        {"task": "text-generation", "source": f"file://{directory}", "device": "cpu",
         "generation": {"max_new_tokens": 64}}
    )  # fmt: skip
    loaded = load_text_generation(spec, str(directory), ModelExecutor())
    assert isinstance(loaded, TokenGenerationModel)
    loaded.engine.set_max_running(8)
    return loaded


@pytest.fixture
def engine(model: TokenGenerationModel) -> GenerationEngine:
    model.engine.prefix_cache.set_capacity(0)
    model.engine.prefix_cache.set_capacity(64 << 20)
    return model.engine


def run(
    engine: GenerationEngine,
    prompts: Sequence[Sequence[int]],
    salt: str = "",
    params: GenerationParams = GREEDY,
) -> list[tuple[list[int], int]]:
    """Each prompt's new tokens and cached prompt tokens, all submitted at once (one batch)."""
    chunks: list[list[Chunk]] = [[] for _ in prompts]
    for index, prompt in enumerate(prompts):
        request = GenerationRequest("", tuple(prompt), params)
        deliver = functools.partial(_append, chunks[index])
        engine.queue.push(SequenceState(request, deliver, salt=salt), engine.queue.classes[0].name)
    with torch.inference_mode():
        while engine.waiting or engine.running:
            for sequence, chunk in engine._iterate():
                sequence.deliver(chunk)
    return [([t for c in cs for t in c.token_ids], sum(c.cached_tokens for c in cs)) for cs in chunks]


def _append(chunks: list[Chunk], chunk: Chunk | BaseException) -> None:
    assert isinstance(chunk, Chunk), chunk
    chunks.append(chunk)


def without_cache(engine: GenerationEngine, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    cache, engine.prefix_cache = engine.prefix_cache, PrefixCache(0)
    try:
        return [made for made, _ in run(engine, prompts)]
    finally:
        engine.prefix_cache = cache


def vocabulary(engine: GenerationEngine, count: int, seed: int) -> list[int]:
    size = engine._model.config.vocab_size
    rng = random.Random(seed)
    return [rng.randrange(size) for _ in range(count)]


AROUND_BOUNDARIES = [
    n
    for block in (1, 2, 3)
    for n in (block * BLOCK_TOKENS - 1, block * BLOCK_TOKENS, block * BLOCK_TOKENS + 1)
]


def test_greedy_tokens_are_the_same_after_a_shared_prefix_of_any_length(engine: GenerationEngine) -> None:
    shared = vocabulary(engine, 4 * BLOCK_TOKENS, seed=1)
    prompts = [shared[:n] + vocabulary(engine, 5, seed=100 + n) for n in AROUND_BOUNDARIES]
    expected = without_cache(engine, prompts)
    run(engine, [shared])  # its blocks cached: each prompt shares what it begins with
    one_by_one = [run(engine, [prompt])[0] for prompt in prompts]
    assert [made for made, _ in one_by_one] == expected
    # Whole blocks of what each shares, and never the last token of a prompt.
    assert [cached for _, cached in one_by_one] == [
        n // BLOCK_TOKENS * BLOCK_TOKENS for n in AROUND_BOUNDARIES
    ]
    together = run(engine, prompts)  # all in one prefill, each now hitting its own blocks too
    assert [made for made, _ in together] == expected
    assert [cached for _, cached in together] == [
        min((n + 5) // BLOCK_TOKENS * BLOCK_TOKENS, n + 4) for n in AROUND_BOUNDARIES
    ]


def test_a_prompt_that_is_all_cached_still_computes_its_last_token(engine: GenerationEngine) -> None:
    prompt = vocabulary(engine, 2 * BLOCK_TOKENS, seed=2)
    (expected,) = without_cache(engine, [prompt])
    assert run(engine, [prompt])[0] == (expected, 0)
    assert run(engine, [prompt])[0] == (expected, 2 * BLOCK_TOKENS - 1)


def test_a_sequence_beside_cached_ones_and_the_next_turn_hit_the_blocks_of_an_answer(
    engine: GenerationEngine,
) -> None:
    first = vocabulary(engine, 30, seed=3)  # one whole block; with its answer, two
    ((answer, cached),) = run(engine, [first])
    assert cached == 0
    # The next turn: the conversation so far (prompt and answer) and a new question.
    second = first + answer + vocabulary(engine, 7, seed=4)
    unrelated = vocabulary(engine, 23, seed=5)
    expected = without_cache(engine, [second, unrelated])
    got = run(engine, [second, unrelated])
    assert [made for made, _ in got] == expected
    # Every token in the cache when the first ended: its prompt and all of its answer but the last.
    assert got[0][1] == (len(first) + NEW_TOKENS - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert got[1][1] == 0


def test_sampled_sequences_are_reproducible_with_the_cache(engine: GenerationEngine) -> None:
    prompt = vocabulary(engine, 50, seed=6)
    sampled = GenerationParams(max_new_tokens=NEW_TOKENS, temperature=0.9, top_k=20, seed=7)
    first = run(engine, [prompt], params=sampled)[0]
    again = run(engine, [prompt], params=sampled)[0]
    assert first[1] == 0 and again[1] == 48
    assert again[0] == first[0]


def test_one_callers_blocks_are_never_anothers(engine: GenerationEngine) -> None:
    prompt = vocabulary(engine, 60, seed=8)
    assert run(engine, [prompt], salt="alice")[0][1] == 0
    assert run(engine, [prompt], salt="bob")[0][1] == 0, "bob hit alice's blocks"
    assert run(engine, [prompt], salt="")[0][1] == 0, "an anonymous request hit alice's blocks"
    assert run(engine, [prompt], salt="alice")[0][1] == 48
    assert run(engine, [prompt], salt="bob")[0][1] == 48


def test_under_a_small_bound_the_cache_evicts_and_stays_exact(engine: GenerationEngine) -> None:
    prompts = [vocabulary(engine, 50, seed=10 + n) for n in range(4)]  # three blocks each
    expected = without_cache(engine, prompts)
    run(engine, prompts[:1])
    engine.prefix_cache.set_capacity(5 * engine.prefix_cache.block_bytes)
    got = [run(engine, [prompt])[0][0] for prompt in prompts]
    assert got == expected
    assert engine.prefix_cache.bytes_held <= engine.prefix_cache.capacity_bytes
    assert engine.prefix_cache.stats.evicted_blocks > 0
    # The last prompt's blocks are the most recent: it hits, within the bound.
    assert run(engine, prompts[-1:])[0] == (expected[-1], 48)


def test_a_prompt_longer_than_the_cache_finds_every_block_the_cache_holds(engine: GenerationEngine) -> None:
    prompt = vocabulary(engine, 60 * BLOCK_TOKENS, seed=30)
    (expected,) = without_cache(engine, [prompt])
    cache = engine.prefix_cache
    cache.set_capacity(48 * BLOCK_TOKENS * engine.token_bytes)  # 48 blocks (token_bytes: known now)
    answers = []
    for _ in range(3):
        answers.append(run(engine, [prompt])[0])
        assert cache.bytes_held <= cache.capacity_bytes
    assert answers == [(expected, 0), (expected, 48 * BLOCK_TOKENS), (expected, 48 * BLOCK_TOKENS)]
    assert cache.blocks == 48


def test_a_sequence_paused_for_a_higher_class_resumes_from_its_own_blocks(engine: GenerationEngine) -> None:
    low_prompt, high_prompt = vocabulary(engine, 40, seed=20), vocabulary(engine, 9, seed=21)
    long = GenerationParams(max_new_tokens=12, min_new_tokens=12)
    ((expected, _),) = run(engine, [low_prompt], params=long, salt="uncached")
    engine.set_classes((PriorityClass("high", 10), PriorityClass("low", 0)), "low", first_come=False)
    engine.set_max_running(1)
    try:
        chunks: dict[str, list[Chunk]] = {"low": [], "high": []}

        def submit(name: str, prompt: list[int], params: GenerationParams) -> SequenceState:
            request = GenerationRequest("", tuple(prompt), params)
            deliver = functools.partial(_append, chunks[name])
            state = SequenceState(request, deliver, priority_class=name, priority=10 if name == "high" else 0)
            engine.queue.push(state, name)
            return state

        paused = submit("low", low_prompt, long)
        with torch.inference_mode():
            for _ in range(4):  # the low sequence runs a few steps alone
                for sequence, chunk in engine._iterate():
                    sequence.deliver(chunk)
            submit("high", high_prompt, GREEDY)  # it takes the only row: the low one is paused
            while engine.waiting or engine.running:
                for sequence, chunk in engine._iterate():
                    sequence.deliver(chunk)
    finally:
        engine.set_max_running(8)
        engine.set_classes(NO_CLASSES.classes, NO_CLASSES.default.name, first_come=False)
    low = [token for chunk in chunks["low"] for token in chunk.token_ids]
    assert low == expected and len(chunks["high"]) == NEW_TOKENS
    # Its resumption copied the blocks it had made (its prompt and tokens so far: two whole blocks)
    # instead of computing them again.
    assert paused.cached_tokens == 2 * BLOCK_TOKENS
    assert chunks["low"][0].cached_tokens == 0  # a first join found nothing of this caller's
