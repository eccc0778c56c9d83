"""The keys and values of the running sequences: one row of a buffer per sequence.

For every layer, one buffer of keys and one of values, [rows, heads, columns, head dim]. Row i
holds sequence i's context from column 0 on; each sequence writes its next token at its own
column (its length), so sequences of any length share a decoding step with no re-padding, and
a sequence that ends only frees its row (the last row moves into the hole, so the running rows
stay 0..n-1). Attention reads columns up to the longest sequence, masked per row.

The buffers grow (by copying) to the rows and columns the engine reserves, and are dropped when
no sequence runs: memory follows the work, and is bounded by max_batch_size x the model's context.

The model calls `update` from each attention layer, as it would call a transformers `Cache`:
`prefill` and `decode` say beforehand where this forward pass writes.
"""

from __future__ import annotations

from typing import Any

import torch


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
        self._prefill: tuple[int, list[int]] | None = None  # (first row, prompt lengths)
        # ... or a decoding step (rows 0..n-1, each at its own column).
        self._positions: torch.Tensor | None = None
        self._width = 0

    # -- what the engine says ------------------------------------------------------------

    def reserve(self, rows: int, columns: int) -> None:
        """The buffers must hold `rows` sequences of up to `columns` tokens (they grow lazily)."""
        self._rows, self._columns = max(self._rows, rows), max(self._columns, columns)

    def release(self) -> None:
        """Drop the buffers (no sequence runs)."""
        self._keys, self._values = [], []
        self._rows = self._columns = 0

    def prefill(self, first_row: int, lengths: list[int]) -> None:
        """The next forward pass is the prompts of new sequences, left-padded to the longest,
        for rows first_row, first_row + 1, ..."""
        self._prefill, self._positions = (first_row, lengths), None

    def decode(self, positions: torch.Tensor, width: int) -> None:
        """The next forward pass is one token for each of rows 0..n-1, at these columns
        (`width`: the highest of them, plus one)."""
        self._prefill, self._positions, self._width = None, positions, width

    def move_row(self, source: int, target: int, length: int) -> None:
        """Row `source`'s first `length` columns become row `target`'s (a sequence ended there)."""
        for buffer in (*self._keys, *self._values):
            buffer[target, :, :length] = buffer[source, :, :length]

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
            first, lengths = self._prefill
            padded = key_states.shape[2]
            for index, length in enumerate(lengths):
                keys[first + index, :, :length] = key_states[index, :, padded - length :]
                values[first + index, :, :length] = value_states[index, :, padded - length :]
            return key_states, value_states  # a prefill attends to its own prompts only
        assert self._positions is not None, "the engine says where a forward pass writes"
        rows = torch.arange(key_states.shape[0], device=key_states.device)
        keys[rows, :, self._positions] = key_states[:, :, 0]
        values[rows, :, self._positions] = value_states[:, :, 0]
        return keys[: len(rows), :, : self._width], values[: len(rows), :, : self._width]

    def _buffers(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self._keys) <= layer:
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
