"""The prefix cache: keys and values of whole token blocks that earlier sequences computed, kept so
that a new prompt that begins with the same tokens copies them instead of computing them again
(vLLM's automatic prefix caching, SGLang's RadixAttention).

A block is BLOCK_TOKENS tokens at a fixed place in a sequence. Its key is a digest chained over
the salt and every token up to its end, so two blocks have one key only when everything before
them is the same, which is exactly when their keys and values are. The salt is the caller's
scope (`model.generation.prefix_cache_scope`): two callers' prompts never share a block unless
the deployment says they may. The digests are keyed with a secret drawn when the process starts,
so nobody outside can make two different prefixes collide.

Blocks live in one buffer per layer, [blocks, heads, BLOCK_TOKENS, head dim], that grows up to
the byte bound; a full cache evicts the least recently used block. A match reads a run of blocks
from the first, so a sequence stores only such a run: its blocks from the first, as many as the
bound holds (a block after one the cache lacks could never be read, and would evict one that
could). A sequence's blocks are touched last to first, so a block is evicted before the blocks in
front of it: a long prompt loses its tail before its head, what it keeps is always a run from its
first block, and a system prompt outlives the conversations that begin with it.

Everything here runs on the engine's thread; the counters are read at scrape time.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Tokens per block: vLLM's default. Shorter blocks match more of a prompt that differs mid-block,
# and cost more digests, bookkeeping and copies per token.
BLOCK_TOKENS = 16
# The default bound when the pod names no memory: the replica cannot know what it may use, and a
# gibibyte holds thousands of prompts of a small model (the tiny GPT-2: 8 KiB a token, 131,072
# tokens) without crowding a node.
UNSIZED_CAPACITY_BYTES = 1 << 30


def default_capacity_bytes(budget_bytes: int | None, used_bytes: int, running_bytes: int) -> int:
    """The bound `model.generation.prefix_cache_bytes` defaults to: half of what `budget_bytes` (the
    pod's memory request; on a GPU, its memory free after the warm-up) leaves once `used_bytes`
    (what the loaded, warm process holds) and `running_bytes` (the running sequences' cache at
    its bound) are set aside; the other half is room for everything else a replica allocates
    (requests, answers, the allocator's slack). UNSIZED_CAPACITY_BYTES without a budget."""
    if budget_bytes is None:
        return UNSIZED_CAPACITY_BYTES
    return max(0, (budget_bytes - used_bytes - running_bytes) // 2)


def extend_keys(keys: list[bytes], token_ids: Sequence[int], salt: str, secret: bytes) -> list[bytes]:
    """`keys` (those of the first blocks of `token_ids`, computed before) extended to every whole
    block of `token_ids`; each key is a digest of the one before it and the block's tokens (the
    first: of the salt and its tokens). Returns `keys`, extended in place."""
    whole = len(token_ids) // BLOCK_TOKENS
    for block in range(len(keys), whole):
        digest = hashlib.blake2b(digest_size=16, key=secret)
        if block:
            digest.update(keys[block - 1])
        else:
            scope = salt.encode()
            digest.update(len(scope).to_bytes(4, "little") + scope)
        start = block * BLOCK_TOKENS
        digest.update(array("I", token_ids[start : start + BLOCK_TOKENS]).tobytes())
        keys.append(digest.digest())
    return keys


@dataclass(slots=True)
class PrefixStats:
    """What the cache did since the replica started (metrics read them at scrape time)."""

    queried_tokens: int = 0  # prompt tokens looked up
    hit_tokens: int = 0  # of them, found cached (and not computed)
    stored_blocks: int = 0
    evicted_blocks: int = 0


class PrefixCache:
    """Whole blocks of keys and values by key, bounded in bytes, least recently used evicted first."""

    def __init__(self, capacity_bytes: int, secret: bytes | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.secret = secret if secret is not None else os.urandom(16)
        self.stats = PrefixStats()
        self._slots: OrderedDict[bytes, int] = OrderedDict()  # key -> slot, least recently used first
        self._free: list[int] = []
        self._keys: list[torch.Tensor] = []  # per layer: [slots, heads, BLOCK_TOKENS, head dim]
        self._values: list[torch.Tensor] = []
        self.block_bytes = 0  # known once the first block is stored

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    @property
    def blocks(self) -> int:
        return len(self._slots)

    @property
    def bytes_held(self) -> int:
        return len(self._slots) * self.block_bytes

    def set_capacity(self, capacity_bytes: int) -> None:
        """A new bound (0: off); blocks beyond it are evicted now."""
        self.capacity_bytes = capacity_bytes
        if self.block_bytes:
            while self._slots and len(self._slots) > self._max_blocks():
                self._evict()
        if not self.enabled:
            self.clear()

    def clear(self) -> None:
        """Forget every block and every count (after the warm-up, whose prompts nobody sends)."""
        self._slots.clear()
        self._free.clear()
        self._keys, self._values = [], []
        self.block_bytes = 0
        self.stats = PrefixStats()

    # -- lookup ----------------------------------------------------------------------------

    def match(self, keys: Sequence[bytes]) -> list[int]:
        """The slots of the longest run of `keys` from the first that is cached, touched (last to
        first)."""
        found: list[int] = []
        for key in keys:
            slot = self._slots.get(key)
            if slot is None:
                break
            found.append(slot)
        for key in reversed(keys[: len(found)]):
            self._slots.move_to_end(key)
        return found

    def count(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A prompt of `prompt_tokens` was looked up; `cached_tokens` of it are copied, not computed."""
        self.stats.queried_tokens += prompt_tokens
        self.stats.hit_tokens += cached_tokens

    def copy_to(
        self,
        layer: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        placements: Sequence[tuple[int, Sequence[int]]],
    ) -> None:
        """Copy blocks into rows of one layer's running buffers ([rows, heads, columns, head dim]):
        each placement is (row, slots), the slots' blocks laid out from column 0."""
        for row, slots in placements:
            if not slots:
                continue
            span = len(slots) * BLOCK_TOKENS
            for pool, buffer in ((self._keys[layer], keys), (self._values[layer], values)):
                span_of = buffer[row, :, :span]
                target = span_of.view(span_of.shape[0], len(slots), BLOCK_TOKENS, span_of.shape[2])
                target.copy_(_gathered(pool, slots).transpose(0, 1))

    # -- storing ---------------------------------------------------------------------------

    def store(
        self, keys: Sequence[bytes], row: int, buffers: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        """Keep the blocks `keys` name (a sequence's, from its first), read from `row` of the running
        buffers (one (keys, values) pair per layer; block i at columns i*BLOCK_TOKENS onwards): the
        first of them, as many as the bound holds, since a match reads no block past one the cache
        lacks. Blocks already cached are only touched; the least recently used blocks, never one of
        these, are evicted to stay within the bound."""
        if not self.enabled or not keys or not buffers:
            return
        if not self.block_bytes:
            self._lay_out(buffers)
        limit = self._max_blocks()
        keys = keys[:limit]
        self._touch(keys)  # what is cached already is not what makes room for the rest
        new = [index for index, key in enumerate(keys) if key not in self._slots]
        slots: list[int] = []
        for index in new:
            while len(self._slots) >= limit:
                self._evict()
            slot = self._free.pop() if self._free else len(self._slots)
            self._grow(slot + 1)
            self._slots[keys[index]] = slot
            slots.append(slot)
        self._touch(keys)
        if not new:
            return
        self.stats.stored_blocks += len(new)
        for layer, (layer_keys, layer_values) in enumerate(buffers):
            for pool, buffer in ((self._keys[layer], layer_keys), (self._values[layer], layer_values)):
                blocks = _blocks_of(buffer[row], new)  # [heads, n, BLOCK_TOKENS, dim]
                if _consecutive(slots):
                    pool[slots[0] : slots[0] + len(slots)] = blocks.transpose(0, 1)
                else:
                    pool[torch.tensor(slots, device=pool.device)] = blocks.transpose(0, 1)

    def _touch(self, keys: Sequence[bytes]) -> None:
        """Most recently used, last to first: the first block is the last of them to be evicted."""
        for key in reversed(keys):
            if key in self._slots:
                self._slots.move_to_end(key)

    def _max_blocks(self) -> int:
        return self.capacity_bytes // self.block_bytes if self.block_bytes else 0

    def _lay_out(self, buffers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The block's shape and size, from the running buffers' (learnt at the first store)."""
        self.block_bytes = sum(
            2 * keys.shape[1] * BLOCK_TOKENS * keys.shape[3] * keys.element_size() for keys, _ in buffers
        )
        shapes = [(keys, (0, keys.shape[1], BLOCK_TOKENS, keys.shape[3])) for keys, _ in buffers]
        self._keys = [keys.new_empty(shape) for keys, shape in shapes]
        self._values = [keys.new_empty(shape) for keys, shape in shapes]

    def _grow(self, slots: int) -> None:
        """The buffers hold at least `slots` blocks: grown by half at least (copies stay rare),
        never past the bound."""
        current = self._keys[0].shape[0]
        if slots <= current:
            return
        size = max(slots, min(self._max_blocks(), max(64, current + current // 2)))
        for pools in (self._keys, self._values):
            for layer, pool in enumerate(pools):
                grown = pool.new_empty((size, *pool.shape[1:]))
                grown[:current] = pool
                pools[layer] = grown

    def _evict(self) -> None:
        _, slot = self._slots.popitem(last=False)
        self._free.append(slot)
        self.stats.evicted_blocks += 1


def _consecutive(slots: Sequence[int]) -> bool:
    return all(b - a == 1 for a, b in itertools.pairwise(slots))


def _gathered(pool: torch.Tensor, slots: Sequence[int]) -> torch.Tensor:
    """The blocks in `slots`, in order: a view where they lie side by side (they usually do: a
    prompt's blocks are stored together), else a copy."""
    if _consecutive(slots):
        return pool[slots[0] : slots[0] + len(slots)]
    return pool.index_select(0, torch.tensor(slots, device=pool.device))


def _blocks_of(row: torch.Tensor, blocks: Sequence[int]) -> torch.Tensor:
    """Blocks of one row ([heads, columns, dim]) as [heads, n, BLOCK_TOKENS, dim]: a view where they
    lie side by side (a sequence's new blocks do), else a copy."""
    if _consecutive(blocks):
        span = row[:, blocks[0] * BLOCK_TOKENS : (blocks[-1] + 1) * BLOCK_TOKENS]
        return span.view(span.shape[0], len(blocks), BLOCK_TOKENS, span.shape[2])
    columns = [block * BLOCK_TOKENS + offset for block in blocks for offset in range(BLOCK_TOKENS)]
    picked = row.index_select(1, torch.tensor(columns, device=row.device))
    return picked.view(picked.shape[0], len(blocks), BLOCK_TOKENS, picked.shape[2])
