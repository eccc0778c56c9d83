"""The keys and values of the running sequences: one row of a buffer per sequence.

For every layer, one buffer of keys and one of values, [rows, heads, columns, head dim]. Row i
holds sequence i's context from column 0 on; each sequence writes its next token at its own
column (its length), so sequences of any length share a decoding step with no re-padding, and
a sequence that ends only frees its row (the last row moves into the hole, so the running rows
stay 0..n-1). Attention reads columns up to the longest sequence, masked per row.

The buffers grow (by copying) to the rows and columns the engine reserves, and are dropped when
no sequence runs: memory follows the work, and is bounded by max_batch_size x the model's context.

The model calls `update` from each attention layer, as it would call a transformers `Cache`:
`prefill` and `decode` say beforehand where this forward pass writes. A prefill whose sequences
begin with cached blocks (`prefix_cache`) has them copied into their rows layer by layer, as the
forward pass reaches each layer, and its new tokens attend to those rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# Copies cached blocks into rows of one layer's buffers: (layer, keys, values).
BlockCopy = Callable[[int, torch.Tensor, torch.Tensor], None]


class SlotCache:
    """The running sequences' KV cache, passed to the model as `past_key_values`."""

    def __init__(self, max_rows: int, max_columns: int) -> None:
        self.max_rows = max_rows  # the bounds: max_batch_size sequences of the model's context
        self.max_columns = max_columns
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._rows = 0  # what the buffers must hold, as reserved by the engine
        self._columns = 0
        # Where the current forward pass writes: a prefill (new sequences, left-padded) ...
        self._prefill: tuple[int, Sequence[int], Sequence[int]] | None = None  # first row, lengths, starts
        self._copy: BlockCopy | None = None  # the cached blocks a prefill begins with
        # ... or a decoding step (rows 0..n-1, each at its own column).
        self._positions: torch.Tensor | None = None
        self._width = 0
        self._token_bytes: dict[int, int] = {}  # per layer: the bytes of one token's keys and values

    # -- what the engine says ------------------------------------------------------------

    def reserve(self, rows: int, columns: int) -> None:
        """The buffers must hold `rows` sequences of up to `columns` tokens (they grow lazily)."""
        self._rows, self._columns = max(self._rows, rows), max(self._columns, columns)

    def release(self) -> None:
        """Drop the buffers (no sequence runs)."""
        self._keys, self._values = [], []
        self._rows = self._columns = 0

    def prefill(
        self,
        first_row: int,
        lengths: Sequence[int],
        starts: Sequence[int] | None = None,
        copy: BlockCopy | None = None,
    ) -> None:
        """The next forward pass is the prompts of new sequences for rows first_row, first_row + 1,
        ...: tokens starts[i] to lengths[i] of each (all of them without `starts`), left-padded to
        the longest; `copy` puts each row's cached tokens before its start."""
        self._prefill, self._positions = (first_row, lengths, starts or [0] * len(lengths)), None
        self._copy = copy

    def decode(self, positions: torch.Tensor, width: int) -> None:
        """The next forward pass is one token for each of rows 0..n-1, at these columns
        (`width`: the highest of them, plus one)."""
        self._prefill, self._positions, self._width = None, positions, width

    def move_row(self, source: int, target: int, length: int) -> None:
        """Row `source`'s first `length` columns become row `target`'s (a sequence ended there)."""
        for buffer in (*self._keys, *self._values):
            buffer[target, :, :length] = buffer[source, :, :length]

    @property
    def buffers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (keys, values) buffers, [rows, heads, columns, head dim] (empty when released)."""
        return list(zip(self._keys, self._values, strict=True))

    @property
    def token_bytes(self) -> int:
        """The bytes of one token's keys and values over every layer (known after a first forward pass)."""
        return sum(self._token_bytes.values())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._keys, *self._values))

    # -- what the model calls ------------------------------------------------------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # Only asked for when no position_ids are given; the engine always gives them.
        return 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this layer's new keys and values; return what its attention reads."""
        keys, values = self._buffers(layer_idx, key_states)
        if self._prefill is not None:
            first, lengths, starts = self._prefill
            if self._copy is not None:
                self._copy(layer_idx, keys, values)
            padded = key_states.shape[2]
            for index, (length, start) in enumerate(zip(lengths, starts, strict=True)):
                new = length - start
                keys[first + index, :, start:length] = key_states[index, :, padded - new :]
                values[first + index, :, start:length] = value_states[index, :, padded - new :]
            if not any(starts):
                return key_states, value_states  # nothing cached: a prefill attends to its own prompts
            last, width = first + len(lengths), max(lengths)
            return keys[first:last, :, :width], values[first:last, :, :width]
        assert self._positions is not None, "the engine says where a forward pass writes"
        rows = torch.arange(key_states.shape[0], device=key_states.device)
        keys[rows, :, self._positions] = key_states[:, :, 0]
        values[rows, :, self._positions] = value_states[:, :, 0]
        return keys[: len(rows), :, : self._width], values[: len(rows), :, : self._width]

    def _buffers(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self._keys) <= layer:
            self._token_bytes[len(self._keys)] = 2 * like.shape[1] * like.shape[3] * like.element_size()
            self._keys.append(like.new_zeros((0, like.shape[1], 0, like.shape[3])))
            self._values.append(like.new_zeros((0, like.shape[1], 0, like.shape[3])))
        keys, values = self._keys[layer], self._values[layer]
        if keys.shape[0] < self._rows or keys.shape[2] < self._columns:
            rows = _grown_size(keys.shape[0], self._rows, self.max_rows)
            columns = _grown_size(keys.shape[2], self._columns, self.max_columns)
            keys, values = _grown(keys, rows, columns), _grown(values, rows, columns)
            self._keys[layer], self._values[layer] = keys, values
        return keys, values


def _grown_size(current: int, needed: int, bound: int) -> int:
    """Grow by at least half (so that copies are rare), never past the bound."""
    if needed <= current:
        return current
    return max(needed, min(bound, current + current // 2))


def _grown(buffer: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """A larger buffer with the old one's content."""
    old_rows, heads, old_columns, dim = buffer.shape
    grown = buffer.new_zeros((rows, heads, columns, dim))
    grown[:old_rows, :, :old_columns] = buffer
    return grown
