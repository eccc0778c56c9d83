"""Prefix-aware routing, the pure part: what a prompt is in each body, chunks that chain, an index
of what went where (bounded, least recently used forgotten), and the choice within the load guard."""

from __future__ import annotations

import random
from collections import Counter

from batchd.router.prefixes import (
    HIT,
    IMBALANCED,
    MISS,
    LoadGuard,
    PrefixIndex,
    chunk_hashes,
    pick_by_prefix,
    prompt_text,
)

SYSTEM = "You are a careful assistant who answers in full sentences. " * 5  # four chunks of 64 and more


def hashes(text: str, scope: str = "") -> tuple[int, ...]:
    return chunk_hashes(text, scope, chunk_chars=64, max_chunks=256)


def test_the_prompt_of_every_generation_body() -> None:
    assert prompt_text({"text_input": "Once upon"}, "text_input") == "Once upon"
    assert prompt_text({"instances": ["first", "second"]}, "instances") == "first"
    assert prompt_text({"prompt": [[5, 6, 7]]}, "prompt") == "5 6 7"
    assert prompt_text({"prompt": [5, 6, 7]}, "prompt") == "5 6 7"
    assert prompt_text({"prompt": {"not": "a prompt"}}, "prompt") is None
    assert prompt_text(["no", "object"], "prompt") is None
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    first = prompt_text({"messages": [{"role": "user", "content": parts}]}, "messages")
    assert first == prompt_text({"messages": [{"role": "user", "content": "Hello"}]}, "messages")


def test_a_later_turn_of_a_chat_begins_with_the_earlier_turn() -> None:
    turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is batching?"}]
    later = [
        *turn,
        {"role": "assistant", "content": "Gathering requests."},
        {"role": "user", "content": "Why?"},
    ]
    earlier_text, later_text = (
        prompt_text({"messages": turn}, "messages"),
        prompt_text({"messages": later}, "messages"),
    )
    assert earlier_text is not None and later_text is not None
    earlier, whole = hashes(earlier_text), hashes(later_text)
    assert len(earlier) >= 4 and whole[: len(earlier)] == earlier


def test_chunks_chain_over_everything_before_them_and_the_scope() -> None:
    text = SYSTEM + "and a question of its own"
    assert len(hashes(text)) == len(text) // 64
    assert hashes(text)[:3] == hashes(SYSTEM[: 3 * 64])
    changed = "Z" + text[1:]
    assert not set(hashes(changed)) & set(hashes(text)), "a change in the first chunk changes every chunk"
    assert not set(hashes(text, "alice")) & set(hashes(text, "bob"))
    assert len(chunk_hashes(text, "", chunk_chars=64, max_chunks=2)) == 2
    assert hashes("short") == ()


def test_the_index_matches_chunks_from_the_first_and_forgets_the_least_recently_used() -> None:
    a, b = hashes(SYSTEM + "first question, long enough to be a chunk of its own..........."), hashes(SYSTEM)
    index = PrefixIndex(chunks_per_replica=len(a) + 1)
    index.record("r1", a)
    index.record("r2", b)
    assert index.matched(["r1", "r2", "r3"], a) == {"r1": len(a), "r2": len(b)}
    assert index.matched(["r2"], a) == {"r2": len(b)}, "only the candidates"
    assert index.matched(["r1", "r2"], hashes("another prompt entirely " * 8)) == {}
    other = hashes("a different system prompt, long enough for two chunks of the index........." * 3)
    index.record("r1", other[:3])
    # r1 holds len(a) + 1 chunks at most: the tail of its older prompt went, its head stayed.
    assert index.chunks("r1") == len(a) + 1 and index.matched(["r1"], a) == {"r1": len(a) - 2}
    index.forget("r1")
    assert index.matched(["r1", "r2"], a) == {"r2": len(b)}


def test_a_prefix_goes_to_the_replica_that_holds_most_of_it_the_less_loaded_of_equals() -> None:
    guard = LoadGuard(slack_items=4, ratio=1.5)
    rng = random.Random(1)
    loads = {"a": 3.0, "b": 0.0, "c": 1.0}
    assert pick_by_prefix(list(loads), {"a": 5, "c": 2}, loads.__getitem__, guard, rng) == ("a", HIT)
    assert pick_by_prefix(list(loads), {"a": 5, "c": 5}, loads.__getitem__, guard, rng) == ("c", HIT)
    picked = Counter(
        pick_by_prefix(["a", "b"], {"a": 1, "b": 1}, lambda _: 0.0, guard, rng)[0] for _ in range(200)
    )
    assert 60 < picked["a"] < 140, "equals share at random"


def test_past_the_load_guard_a_request_goes_by_load() -> None:
    guard = LoadGuard(slack_items=4, ratio=1.5)
    rng = random.Random(2)
    busy = {"a": 9.0, "b": 4.0}  # 5 above b, and over 1.5 times: too busy
    assert pick_by_prefix(["a", "b"], {"a": 3}, busy.__getitem__, guard, rng) == ("b", IMBALANCED)
    # Within the slack, or within the ratio of a loaded fleet, the prefix wins.
    assert pick_by_prefix(["a", "b"], {"a": 3}, {"a": 8.0, "b": 4.0}.__getitem__, guard, rng) == ("a", HIT)
    assert pick_by_prefix(["a", "b"], {"a": 3}, {"a": 30.0, "b": 24.0}.__getitem__, guard, rng) == ("a", HIT)
    # A busy holder of the whole prefix loses to an idle holder of part of it.
    partly = {"a": 9.0, "b": 4.0, "c": 0.0}
    assert pick_by_prefix(list(partly), {"a": 3, "b": 1}, partly.__getitem__, guard, rng) == ("b", HIT)
    assert pick_by_prefix(["a", "b"], {}, busy.__getitem__, guard, rng) == ("b", MISS)
    assert pick_by_prefix([], {}, busy.__getitem__, guard, rng) == (None, MISS)


def test_one_hot_prefix_spreads_over_the_replicas_as_they_fill() -> None:
    """Requests that all begin alike, each held until the end: the first replica takes them while
    the guard allows, then the other learns the prefix, and they share it."""
    guard = LoadGuard(slack_items=2, ratio=1.5)
    rng = random.Random(3)
    index = PrefixIndex(chunks_per_replica=100)
    held = Counter({"a": 0, "b": 0})
    prefix = hashes(SYSTEM)
    for _ in range(40):
        matched = index.matched(list(held), prefix)
        replica, _ = pick_by_prefix(list(held), matched, held.__getitem__, guard, rng)
        assert replica is not None
        index.record(replica, prefix)
        held[replica] += 1
    assert abs(held["a"] - held["b"]) <= 3, held
