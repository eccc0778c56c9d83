"""The prefix benchmark's workloads and arithmetic from synthetic outcomes (what a window counts, the
hit rate, ratios within each repeat, the report read back from its JSON), and one smoke-sized run
of the replica and routing parts."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest

from batchd.bench.kit import records
from batchd.bench.kit.command import publish
from batchd.bench.kit.records import RunRecord
from batchd.bench.prefix.__main__ import BENCHMARK
from batchd.bench.prefix.analysis import (
    CACHED,
    PREFIX,
    ROUTED_CONVERSATIONS,
    SYSTEM_CAPACITY,
    TWO_CHOICES,
    UNCACHED,
    UNIQUE_CAPACITY,
    Part,
    Results,
    figures,
    hit_rate_bound,
    medians,
    replica_goals,
)
from batchd.bench.prefix.client import Outcome, reusable_tokens, with_reusable
from batchd.bench.prefix.workload import (
    CHAT,
    COMPLETIONS,
    HOT,
    SYSTEM_PROMPTS,
    UNIQUE,
    Conversation,
    Shape,
    jobs,
)
from batchd.replica.generation.prefix_cache import BLOCK_TOKENS
from tests.bench.conftest import RunModule

META = RunRecord("2026-01-01 00:00 UTC", "test machine", "python -m batchd.bench.prefix")
SHAPE = Shape()


def prompts(workload: str, count: int, seed: int = 1) -> list[list[int]]:
    stream = jobs(workload, SHAPE, vocabulary=1000, seed=seed)
    return [next(stream).body["prompt"] for _ in range(count)]


def test_system_prompts_are_eight_of_768_tokens_and_questions_of_32_to_64() -> None:
    sent = prompts(SYSTEM_PROMPTS, 200)
    assert len({tuple(p[:768]) for p in sent}) == 8
    assert all(768 + 32 <= len(p) <= 768 + 64 for p in sent)
    hot = prompts(HOT, 20)
    assert len({tuple(p[:768]) for p in hot}) == 1
    unique = prompts(UNIQUE, 20)
    assert len({tuple(p[:16]) for p in unique}) == 20, "unique prompts share no first block"
    assert prompts(SYSTEM_PROMPTS, 5, seed=2) != prompts(SYSTEM_PROMPTS, 5, seed=3), "a repeat draws anew"
    assert next(jobs(UNIQUE, SHAPE, 1000, 1)).path == COMPLETIONS


def test_a_conversation_resends_its_whole_history_each_turn() -> None:
    talk = Conversation("be brief", ("one?", "two?", "three?"))
    job = talk.job(["1.", "2."], new_tokens=8)
    assert job.path == CHAT and job.turn == 3
    assert [m["content"] for m in job.body["messages"]] == ["be brief", "one?", "1.", "two?", "2.", "three?"]


def outcome(due: float, first: float, done: float, prompt: int = 100, cached: int = 0) -> Outcome:
    return Outcome(due, first, done, prompt, cached, new_tokens=32)


def test_a_window_counts_answers_between_its_first_and_last_and_the_share_of_cached_prompt() -> None:
    outcomes = [
        outcome(0.0, 0.2, 0.5),  # before the window: not counted
        outcome(1.0, 1.1, 2.0, cached=50),
        outcome(1.5, 1.6, 3.0, cached=100),
        outcome(2.0, 2.5, 4.0),
        Outcome(2.5, None, None, error="503: full"),
        outcome(4.0, 4.5, 9.0),  # after it
    ]
    found = figures(outcomes, since_s=1.0, until_s=5.0)
    assert found.completed == 3 and found.errors == 1 and found.requests == 4
    assert found.rps == 2 / 2.0 and found.tokens_per_s == 64 / 2.0  # the two after the first, over 2 s
    assert found.hit_rate == pytest.approx(150 / 300)
    assert found.ttft_p50_ms == pytest.approx(100)
    later = figures([Outcome(0, 0.1, 1, turn=turn) for turn in (1, 2, 3, 4)], turn_from=3)
    assert later.completed == 2


def test_a_closed_loop_answered_in_rounds_counts_each_clients_own_rate() -> None:
    # Two clients answered together every second: 2 a second (5 answers over 2 s would say 2.5).
    rounds = [dataclasses.replace(outcome(0, t - 0.5, t), client=c) for t in (1.0, 2.0, 3.0) for c in (0, 1)]
    found = figures(rounds, since_s=0.5, until_s=3.5)
    assert found.rps == pytest.approx(2.0) and found.tokens_per_s == pytest.approx(64.0)
    # Requests as long as half the window: one answer a client, counted over the window.
    once = figures(rounds[:2], since_s=0.5, until_s=2.5)
    assert once.rps == pytest.approx(1.0)


def test_goals_are_ratios_within_each_repeat_so_a_slow_minute_cancels_out() -> None:
    def at(rps: float) -> object:
        return figures([outcome(0, 0.1, n / rps) for n in range(11)])

    runs = {
        SYSTEM_CAPACITY: {CACHED: [at(20), at(10), at(22)], UNCACHED: [at(10), at(5), at(10)]},
        UNIQUE_CAPACITY: {CACHED: [at(10)], UNCACHED: [at(10)]},
    }
    goals = {goal.name: goal for goal in replica_goals(runs)}  # type: ignore[arg-type]
    capacity = goals["system prompts: capacity, on / off"]
    assert capacity.repeats == pytest.approx([2.0, 2.0, 2.2]) and capacity.met
    assert goals["unique prompts: capacity, on / off"].met
    assert math.isnan(goals["system prompts: time to first token p50, off / on"].measured)
    assert medians(runs)[SYSTEM_CAPACITY][CACHED].rps == pytest.approx(20)  # type: ignore[arg-type]


def test_a_turn_could_reuse_the_whole_blocks_of_the_turn_before_and_no_more() -> None:
    first = outcome(0, 0.1, 1, prompt=40)  # 40 prompt tokens and 32 new: 71 held, 4 whole blocks
    assert reusable_tokens(120, first) == 4 * BLOCK_TOKENS
    assert reusable_tokens(50, first) == 49, "never the turn's own last token"
    assert with_reusable(outcome(1, 1.1, 2, prompt=120), None).reusable_tokens == 0  # a first turn
    turns = [first, with_reusable(outcome(1, 1.1, 2, prompt=120, cached=48), first)]
    found = figures(turns)
    assert found.hit_rate == pytest.approx(48 / 160)
    assert found.reachable_hit_rate == pytest.approx(64 / 160)
    # The bound of the routing goal: the prefix-aware run's reachable rate over power of two's rate.
    two = figures([first, with_reusable(outcome(1, 1.1, 2, prompt=120, cached=16), first)])
    runs = {ROUTED_CONVERSATIONS: {PREFIX: [found], TWO_CHOICES: [two]}}
    assert hit_rate_bound(runs) == pytest.approx([(64 / 160) / (16 / 160)])


def test_the_report_is_written_and_read_back(tmp_path: Path) -> None:
    rng = random.Random(1)
    runs = {
        load: {
            subject: [
                figures([outcome(0, rng.random(), 1 + n, cached=50) for n in range(5)]) for _ in range(3)
            ]
            for subject in (CACHED, UNCACHED)
        }
        for load in (SYSTEM_CAPACITY, UNIQUE_CAPACITY)
    }
    results = Results(META, {"repeats": 3}, replica=Part("one replica", runs, replica_goals(runs), {}))
    publish(BENCHMARK, results, tmp_path, "prefix")
    markdown = (tmp_path / "prefix.md").read_text()
    assert f"| {SYSTEM_CAPACITY} | {CACHED} |" in markdown and "## Goals" in markdown
    assert (tmp_path / "prefix.png").read_bytes().startswith(b"\x89PNG")
    assert records.from_json(Results, json.loads((tmp_path / "prefix.json").read_text())) == results


def test_the_routers_own_count_of_its_routes_is_summed_over_repeats_and_reported(tmp_path: Path) -> None:
    turns = [outcome(0, 0.1, 1), outcome(1, 1.1, 2, cached=32)]
    aware = [
        dataclasses.replace(figures(turns), routes={"hit": 5, "miss": 2}),
        dataclasses.replace(figures(turns), routes={"hit": 4, "imbalanced": 1, "miss": 2}),
    ]
    runs = {ROUTED_CONVERSATIONS: {PREFIX: aware, TWO_CHOICES: [figures(turns), figures(turns)]}}
    assert medians(runs)[ROUTED_CONVERSATIONS][PREFIX].routes == {"hit": 9, "miss": 4, "imbalanced": 1}
    assert medians(runs)[ROUTED_CONVERSATIONS][TWO_CHOICES].routes == {}  # it routes by load alone
    results = Results(META, {"repeats": 2}, routing=Part("two replicas", runs, [], {}))
    publish(BENCHMARK, results, tmp_path, "prefix")
    markdown = (tmp_path / "prefix.md").read_text()
    assert f"{ROUTED_CONVERSATIONS}: 9 hit, 1 imbalanced, 4 miss." in markdown, markdown
    assert records.from_json(Results, json.loads((tmp_path / "prefix.json").read_text())) == results


@pytest.mark.slow
def test_a_smoke_sized_run_measures_the_cache_and_the_routing(run_module: RunModule, tmp_path: Path) -> None:
    done = run_module(
        "batchd.bench.prefix",
        "--quick",
        "--parts",
        "replica",
        "routing",
        "--output-dir",
        str(tmp_path),
        timeout_s=400,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    markdown = (tmp_path / "prefix.md").read_text()
    for row in ("| system prompts, closed loop | cache on |", "| conversations, open loop | prefix-aware |"):
        assert row in markdown, markdown
    results = json.loads((tmp_path / "prefix.json").read_text())
    cached = results["replica"]["runs"][SYSTEM_CAPACITY][CACHED][0]
    assert cached["errors"] == 0 and cached["hit_rate"] > 0.5, "the system prompts hit the cache"
    assert results["replica"]["runs"][SYSTEM_CAPACITY][UNCACHED][0]["hit_rate"] == 0
    assert (tmp_path / "prefix.png").stat().st_size > 0
    conversations = results["routing"]["runs"][ROUTED_CONVERSATIONS]
    assert conversations[PREFIX][0]["routes"]["hit"] > 0, "later turns went where their conversation was"
    assert conversations[TWO_CHOICES][0]["routes"] == {}
