"""The access benchmark's figures from synthetic rounds (the CPU a credential adds, paired by repeat;
TokenReviews per TTL; the goals), its report read back from its JSON, and one smoke-sized run."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchd.bench.access.__main__ import BENCHMARK
from batchd.bench.access.analysis import (
    Probe,
    Results,
    Reviews,
    Round,
    failure,
    figures,
    goals,
    probe_ratio,
    reviews_per_ttl,
)
from batchd.bench.kit import records
from batchd.bench.kit.command import publish
from batchd.bench.kit.goals import verdicts
from batchd.bench.kit.records import RunRecord
from tests.bench.conftest import RunModule

META = RunRecord("2026-01-01 00:00 UTC", "test machine", "python -m batchd.bench.access")
OPTIONS = {
    "repeats": 2,
    "seconds": 5.0,
    "warmup_s": 0.5,
    "in_flight": 16,
    "decision_iterations": 20000,
    "decision_rounds": 3,
}


def _round(way: str, repeat: int, cpu_us: float, errors: int = 0) -> Round:
    return Round(way, repeat, 1000, errors, 0.5, 1.0, 2000.0, cpu_us)


PROBE = Probe(3, 3, 0, [0.030, 0.026, 0.028], [0.027, 0.029, 0.028])


DECISION = {"off": [9.0, 10.0, 11.0], "key": [12.0, 13.0, 14.0], "token": [19.0, 20.0, 21.0]}


def _results(
    key_us: tuple[float, float] = (210.0, 312.0),
    reviews: int = 1,
    probe: Probe = PROBE,
    decision: dict[str, list[float]] = DECISION,
) -> Results:
    rounds = [
        _round("off", 0, 200.0),
        _round("key", 0, key_us[0]),
        _round("token", 0, 212.0),
        _round("off", 1, 300.0),  # a busier minute: each repeat is paired with its own
        _round("key", 1, key_us[1]),
        _round("token", 1, 314.0),
    ]
    return Results(META, OPTIONS, rounds, Reviews(reviews, 2.0, 300.0), probe, decision)


def test_the_cpu_a_credential_adds_is_paired_with_access_off_in_the_same_repeat() -> None:
    by_way = {f.way: f for f in figures(_results())}
    assert by_way["off"].added_cpu_us == 0.0
    assert by_way["key"].added_cpu_us == pytest.approx(11.0)  # the median of 10 and 12
    assert by_way["token"].added_cpu_us == pytest.approx(13.0)
    assert by_way["key"].router_cpu_us == pytest.approx(261.0)


def test_reviews_are_counted_per_ttl_of_the_tokens_rounds() -> None:
    assert reviews_per_ttl(Reviews(1, 2.0, 300.0)) == 1.0  # under one TTL: one TTL's worth
    assert reviews_per_ttl(Reviews(3, 11.0, 300.0)) == 1.0  # 11 minutes: three TTLs
    assert reviews_per_ttl(Reviews(4, 2.0, 300.0)) == 4.0


def test_the_goals_are_met_or_missed_as_the_issue_states_them() -> None:
    assert set(verdicts(goals(_results())).values()) == {True}
    # The CPU goals are judged on the decision's own cost (the end-to-end rounds are noisier).
    assert set(verdicts(goals(_results(key_us=(230.0, 330.0)))).values()) == {True}
    slow_key = {**DECISION, "key": [26.0, 27.0, 28.0]}  # 17 us more than off's
    missed = verdicts(goals(_results(reviews=2, decision=slow_key)))
    assert list(missed.values()) == [False, True, True, False]
    hit = Probe(3, 3, 1, PROBE.probe_s, PROBE.fresh_s)  # one probe hit alpha's blocks
    sooner = Probe(3, 3, 0, [0.020, 0.021, 0.022], PROBE.fresh_s)  # no hit said, yet faster
    blind = Probe(3, 2, 0, PROBE.probe_s, PROBE.fresh_s)  # a control missed: the probe proves nothing
    for probe in (hit, sooner, blind):
        assert list(verdicts(goals(_results(probe=probe))).values())[2] is False, probe
    assert probe_ratio(PROBE) == 1.0


def test_a_run_with_errors_or_no_rounds_fails_naming_them() -> None:
    assert failure(_results()) is None
    assert failure(Results(META, OPTIONS)) == "no round was measured"
    assert failure(Results(META, OPTIONS, [_round("key", 0, 1.0, errors=2)])) == "key #0: 2 errors"


def test_the_report_is_written_and_read_back(tmp_path: Path) -> None:
    publish(BENCHMARK, _results(), tmp_path, "access")
    assert records.read_sections(Results, tmp_path / "access.json") == _results()
    text = (tmp_path / "access.md").read_text()
    assert "| API key | 0.50 | 1.00 | 2,000 | 261.0 | 11.0 |" in text
    assert "| token (review cached) | 20.0 | 10.0 |" in text
    assert "1 TokenReviews in the token's rounds (2.0 minutes from the first to the last" in text
    assert "one token), 0.50 a minute: 1.0 per review TTL" in text and "NOT met" not in text
    assert "beta's probe hit anything in 0. Beta's probe took 28.0 ms (median) against 28.0 ms" in text
    assert (tmp_path / "access.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_a_smoke_sized_run_measures_every_way_in_and_the_reviews(
    run_module: RunModule, tmp_path: Path
) -> None:
    done = run_module("batchd.bench.access", "--quick", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    results = records.read_sections(Results, tmp_path / "access.json")
    assert {r.way for r in results.rounds} == {"off", "key", "token"}
    assert all(r.requests > 0 and r.errors == 0 for r in results.rounds)
    # The token was reviewed once, and every later request used the cached review.
    assert results.reviews is not None and results.reviews.count == 1
    assert results.probe is not None and results.probe.hits == 0 and results.probe.controls == 2
    assert set(results.decision_us) == {"off", "key", "token"}
