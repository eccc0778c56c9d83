"""The models every peer serves, run here from batchd's environment (the peers' own have the same
pinned torch and transformers): what each server's batch handler calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchd.bench.kit.peer_servers.servers import models
from batchd.bench.peers import generator_bound
from batchd.testing.models import build_gpt2


def test_the_adder_answers_each_item_in_order() -> None:
    assert models.load("adder")([1, 5, -2]) == [2, 6, -1]


@pytest.mark.slow
def test_the_generator_continues_each_prompt_of_a_batch_as_it_would_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(models.GPT2_DIR_VARIABLE, str(build_gpt2(tmp_path / "gpt2")))
    generate = models.load("gpt2")
    short, long = "batching", "a server that gathered requests into batches, one after another"
    together = generate([short, long])
    # One continuation per prompt, in order, without the prompt; the short one is padded on the
    # left, so its continuation is the one it gets alone.
    assert len(together) == 2 and together == [generate([short])[0], generate([long])[0]]
    for text, prompt in zip(together, (short, long), strict=True):
        assert text and not text.startswith(prompt)


@pytest.mark.slow
def test_the_generators_bound_compares_the_same_answers(tmp_path: Path) -> None:
    found = generator_bound.measure(build_gpt2(tmp_path / "gpt2"), repeats=1, rows=2)
    tokens_per_s = found["tokens_per_s"]
    assert isinstance(tokens_per_s, dict) and set(tokens_per_s) == {"generate", "engine"}
    assert all(rate > 0 for rate in tokens_per_s.values())
    assert found["engine_over_generate"] == pytest.approx(tokens_per_s["engine"] / tokens_per_s["generate"])
