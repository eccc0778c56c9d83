"""Each sequence's next token from the model's scores, by that sequence's own parameters.

Sequences side by side in one forward pass want different things: greedy or sampled, their own
temperature, top-k and top-p, their own seed, and the end-of-sequence token held back until
`min_new_tokens`. The rules are transformers' (`MinNewTokensLengthLogitsProcessor`, then the
temperature, top-k and top-p warpers, in that order), so that a greedy sequence is exactly what
`model.generate` makes. A seeded sequence draws from its own generator: its text depends on its
seed, not on which other sequences happened to run beside it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

import torch

from batchd.replica.generation.params import GenerationParams, TokenLogprob


class Row(Protocol):
    """What choosing a sequence's next token needs to know about it."""

    @property
    def params(self) -> GenerationParams: ...

    @property
    def generated(self) -> int:
        """Tokens made so far."""
        ...

    @property
    def generator(self) -> torch.Generator | None:
        """Its random numbers (None for greedy sequences)."""
        ...


def generator_for(params: GenerationParams, device: torch.device) -> torch.Generator | None:
    """A sampled sequence's own random numbers: from its seed, or from the OS when it has none."""
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
    generator.manual_seed(seed)
    return generator


def next_tokens(logits: torch.Tensor, rows: Sequence[Row], eos_ids: Sequence[int]) -> list[int]:
    """The next token of each row: `logits` is [rows, vocabulary], one row per sequence."""
    scores = logits.float()
    held = [index for index, row in enumerate(rows) if row.generated < row.params.min_new_tokens]
    if held and eos_ids:
        if scores.data_ptr() == logits.data_ptr():
            scores = scores.clone()
        held_rows = torch.tensor(held, device=scores.device)
        eos = torch.tensor(list(eos_ids), device=scores.device)
        scores[held_rows[:, None], eos[None, :]] = float("-inf")
    chosen = scores.argmax(dim=-1)
    for index, row in enumerate(rows):
        if not row.params.greedy:
            chosen[index] = sample(scores[index], row.params, row.generator)
    tokens: list[int] = chosen.tolist()
    return tokens


def sample(scores: torch.Tensor, params: GenerationParams, generator: torch.Generator | None) -> int:
    """One draw from one row's scores ([vocabulary]) after temperature, top-k and top-p."""
    probabilities = warped(scores, params).softmax(dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator).item())


def warped(scores: torch.Tensor, params: GenerationParams) -> torch.Tensor:
    """One row's scores after temperature, top-k and top-p, as transformers' warpers leave them."""
    scores = scores / params.temperature
    if params.top_k > 0:
        k = min(params.top_k, scores.shape[-1])
        kth = torch.topk(scores, k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - params.top_p)
        drop[-1] = False  # the most likely token always stays
        scores = scores.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return scores


def token_logprobs(
    logits: torch.Tensor, rows: Sequence[Row], tokens: Sequence[int]
) -> dict[int, TokenLogprob]:
    """The chosen tokens' log-probabilities, for the rows that asked (`params.logprobs`), by row:
    the model's own distribution (its scores before temperature, top-k and top-p), as OpenAI's
    and vLLM's `logprobs` report it."""
    asked = [index for index, row in enumerate(rows) if row.params.logprobs is not None]
    if not asked:
        return {}
    scores = logits[asked].float().log_softmax(dim=-1)
    chosen = scores.gather(1, torch.tensor([tokens[i] for i in asked], device=scores.device)[:, None])
    most = max(rows[i].params.logprobs or 0 for i in asked)
    top_values, top_ids = scores.topk(most, dim=-1) if most else (scores[:, :0], scores[:, :0].long())
    values, ids, picked = top_values.tolist(), top_ids.tolist(), chosen[:, 0].tolist()
    found = {}
    for position, index in enumerate(asked):
        count = rows[index].params.logprobs or 0
        top = tuple(zip(ids[position][:count], values[position][:count], strict=True))
        found[index] = TokenLogprob(tokens[index], picked[position], top)
    return found
