"""Prefix-aware routing: a text-generation request goes to the replica most likely to hold the
beginning of its prompt in its prefix cache, unless that replica is busier than the load guard
allows; then to the better of two by load, so that one hot prefix spreads over the fleet.

Which replica holds what is the router's own approximate index of what it sent where, not the
replicas' word. The router has no tokenizer (its image carries no torch and no transformers),
so it could not name a replica's blocks, which are keyed by token ids; its own index is up to
date at the moment it routes (a burst of requests that begin alike follows the first one at
once, where a reading of `GET /load` every half second would spread the burst before it
showed); and it costs the replicas nothing. That is what the Gateway API Inference Extension's
prefix plugin and SGLang's cache-aware router do, and these defaults are theirs: prompts are cut
into chunks of 64 characters, a chunk's hash chained over every chunk before it (and over the
caller, where the deployment keeps callers apart, as its replicas do); a request matches a
replica by the chunks from the first that the index says were sent there; each replica's chunks
are remembered least recently used first, up to a bound. What a replica evicted, or lost in a
restart, the index still names until its bound forgets it: it is a hint, and a wrong hint costs
one prefill.

For the chat route the prompt is the whole conversation (every message's role and text, in
order), so turn n matches turn n-1 and goes where it went.

The load guard is SGLang's: a replica is too busy for a request when it holds more than `slack`
items above the least loaded replica and more than `ratio` times as many.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchd.router.picker import pick

# How a request was routed (the router's metrics): to a replica holding part of its prompt; by
# load because every such replica was too busy; by load because none held any of it.
HIT = "hit"
IMBALANCED = "imbalanced"
MISS = "miss"
OUTCOMES = (HIT, IMBALANCED, MISS)


def prompt_text(document: Any, field: str) -> str | None:
    """The prompt a request body holds in `field`: a string; the first of a list of prompts (of
    strings or token ids); or a conversation (OpenAI's `messages`), written out whole. None for
    anything else."""
    value = document.get(field) if isinstance(document, dict) else None
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(message, dict) for message in value):
        return "".join(_message(message) for message in value)
    first = value[0]
    if isinstance(first, str):
        return first
    ids = first if isinstance(first, list) else value
    if all(isinstance(token, int) for token in ids):
        return " ".join(map(str, ids))
    return None


def _message(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # text parts
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return f"{message.get('role', '')}\x1f{content or ''}\x1e"


def chunk_hashes(text: str, scope: str, chunk_chars: int, max_chunks: int) -> tuple[int, ...]:
    """The chained hashes of the whole chunks of `text` (at most `max_chunks`), the first over the
    scope: two prompts share a hash exactly where they share everything before it, and the scope."""
    current = hash(("batchd-prefix", scope))
    hashes = []
    for start in range(0, min(len(text) // chunk_chars, max_chunks) * chunk_chars, chunk_chars):
        current = hash((current, text[start : start + chunk_chars]))
        hashes.append(current)
    return tuple(hashes)


class PrefixIndex:
    """Which replica the router sent which prompt chunks to: per replica, its chunks least recently
    used first, up to `chunks_per_replica`; per chunk, the replicas it was sent to."""

    def __init__(self, chunks_per_replica: int) -> None:
        self.chunks_per_replica = chunks_per_replica
        self._sent: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, dict[str, None]] = {}

    def matched(self, replicas: Collection[str], hashes: Sequence[int]) -> dict[str, int]:
        """Per replica among `replicas` that holds the first chunk: how many chunks from the first
        it holds."""
        alive = set(replicas)
        found: dict[str, int] = {}
        for count, chunk in enumerate(hashes, start=1):
            holders = self._holders.get(chunk)
            if not holders:
                break
            alive &= holders.keys()
            if not alive:
                break
            for replica in alive:
                found[replica] = count
        return found

    def record(self, replica: str, hashes: Sequence[int]) -> None:
        """`replica` was sent a prompt of these chunks: they are its most recently used, the first
        most of all (a long prompt's tail is forgotten before its head, as the replica evicts)."""
        if not hashes:
            return
        sent = self._sent.setdefault(replica, OrderedDict())
        for chunk in reversed(hashes):
            sent[chunk] = None
            sent.move_to_end(chunk)
            self._holders.setdefault(chunk, {})[replica] = None
        while len(sent) > self.chunks_per_replica:
            chunk, _ = sent.popitem(last=False)
            self._drop(chunk, replica)

    def forget(self, replica: str) -> None:
        """The replica is gone: nothing is sent there for its prefixes any more."""
        for chunk in self._sent.pop(replica, {}):
            self._drop(chunk, replica)

    def chunks(self, replica: str) -> int:
        return len(self._sent.get(replica, ()))

    def _drop(self, chunk: int, replica: str) -> None:
        holders = self._holders.get(chunk)
        if holders is not None:
            holders.pop(replica, None)
            if not holders:
                del self._holders[chunk]


@dataclass(frozen=True, slots=True)
class LoadGuard:
    """When a replica is too busy to take a request for its prefix (SGLang's balance thresholds)."""

    slack_items: float  # above the least loaded replica's items
    ratio: float  # times the least loaded replica's items

    def too_busy(self, items: float, least: float) -> bool:
        return items > least + self.slack_items and items > least * self.ratio


@dataclass(frozen=True, slots=True)
class PrefixAsk:
    """What routing a request by its prompt needs: its chunks' hashes and its deployment's guard."""

    hashes: tuple[int, ...]
    guard: LoadGuard


def pick_by_prefix(
    candidates: Sequence[str],
    matched: Mapping[str, int],
    load: Callable[[str], float],
    guard: LoadGuard,
    rng: random.Random,
) -> tuple[str | None, str]:
    """The replica for a request whose prompt `matched` says each replica holds the first chunks
    of, and how it was chosen: the longest match among the replicas the guard lets take it (the
    less loaded of equals, at random among equal loads: `HIT`); else the better of two by load
    (`IMBALANCED` where a replica held some of it, `MISS` where none did)."""
    held = [replica for replica in candidates if matched.get(replica)]
    if not held:
        return pick(candidates, load, rng), MISS
    items = {replica: load(replica) for replica in candidates}
    least = min(items.values())
    fit = [replica for replica in held if not guard.too_busy(items[replica], least)]
    if not fit:
        return pick(candidates, load, rng), IMBALANCED
    longest = max(matched[replica] for replica in fit)
    tied = [replica for replica in fit if matched[replica] == longest]
    lightest = min(items[replica] for replica in tied)
    return rng.choice([replica for replica in tied if items[replica] == lightest]), HIT
