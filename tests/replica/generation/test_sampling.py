"""Choosing each row's next token by its own parameters, by transformers' rules."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from batchd.replica.generation.params import GenerationParams
from batchd.replica.generation.sampling import generator_for, next_tokens, warped


@dataclass
class Row:
    params: GenerationParams
    generated: int = 0
    generator: torch.Generator | None = None


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.7, 50, 1.0), (1.3, 0, 0.8), (0.5, 5, 0.3)])
def test_warping_keeps_what_transformers_warpers_keep(temperature: float, top_k: int, top_p: float) -> None:
    scores = torch.randn(1, 1000, generator=torch.Generator().manual_seed(1))
    theirs = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        theirs = TopKLogitsWarper(top_k)(None, theirs)
    if top_p < 1:
        theirs = TopPLogitsWarper(top_p)(None, theirs)
    ours = warped(scores[0], GenerationParams(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs[0]))
    assert torch.allclose(ours[torch.isfinite(ours)], theirs[0][torch.isfinite(theirs[0])])


def test_each_row_by_its_own_parameters() -> None:
    scores = torch.tensor([[0.0, 5.0, 1.0], [0.0, 5.0, 1.0], [9.0, 5.0, 1.0]])
    held = Row(GenerationParams(min_new_tokens=2), generated=1)  # end-of-sequence (0) held back
    rows = [Row(GenerationParams()), Row(GenerationParams()), held]
    assert next_tokens(scores, rows, eos_ids=[0]) == [1, 1, 1]
    sampled = GenerationParams(temperature=1.0, seed=11)
    draws = [
        next_tokens(torch.zeros(1, 50), [Row(sampled, 0, generator_for(sampled, torch.device("cpu")))], [])
    ]
    again = [
        next_tokens(torch.zeros(1, 50), [Row(sampled, 0, generator_for(sampled, torch.device("cpu")))], [])
    ]
    assert draws == again, "the same seed drew differently"
