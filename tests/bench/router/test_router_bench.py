"""The router benchmark's figures from synthetic runs (shares, settling, goals, the report read
back from its JSON), its command line, and one smoke-sized run of the cheap parts."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from batchd.bench.kit import records
from batchd.bench.kit.command import publish
from batchd.bench.kit.goals import verdicts
from batchd.bench.kit.records import RunRecord
from batchd.bench.router.__main__ import BENCHMARK
from batchd.bench.router.analysis import (
    CostResult,
    CostRound,
    KeepaliveResult,
    Results,
    SteadyRun,
    StepRun,
    ZeroResult,
    ZeroRun,
    latency_ms,
    overall_shares,
    settle_s,
    statuses,
    window_shares,
)
from batchd.bench.router.report import (
    cost_figures,
    cost_goals,
    keepalive_goals,
    zero_goals,
)
from batchd.testing.traffic import Outcome
from tests.bench.conftest import RunModule

META = RunRecord("2026-01-01 00:00 UTC", "test machine", "python -m batchd.bench.router")


def test_shares_are_counted_per_window_from_cumulative_answers() -> None:
    # Replica 1 joins at 2 s; from then on both answer alike.
    samples = [(t / 2, [50.0 * t / 2 if t <= 4 else 100 + 25.0 * (t / 2 - 2), 25.0 * max(0, t / 2 - 2)])
               for t in range(0, 11)]  # fmt: skip
    times, shares = window_shares(samples, window_s=1.0)
    assert times[0] == 1.0  # the first full window
    assert shares[0][0] == 1.0 and shares[1][0] == 0.0
    assert shares[0][-1] == pytest.approx(0.5) and shares[1][-1] == pytest.approx(0.5)
    assert settle_s(times, shares[1], since=2.0, replicas=2) == pytest.approx(0.5)


def test_a_replica_that_never_gets_its_share_never_settles() -> None:
    times, shares = [1.0, 2.0, 3.0], [0.0, 0.05, math.nan]
    assert settle_s(times, shares, since=0.0, replicas=4) is None  # half an even share is 12.5%
    assert overall_shares([0, 0], [30, 10]) == [0.75, 0.25]


def test_latency_counts_only_answers_and_statuses_name_no_answer() -> None:
    outcomes = [
        Outcome(0.0, 0.1, "u", 200),
        Outcome(0.0, 0.001, "u", 503, retry_after="5"),
        Outcome(0.0, 30.0, "u", None, error="TimeoutError"),
    ]
    assert latency_ms(outcomes, 50) == pytest.approx(100.0)
    assert statuses(outcomes) == {"200": 1, "503": 1, "None": 1}


def _step(path: str, settle: list[float | None], unanswered: int = 0) -> StepRun:
    shares = [0.25] * 4 if path == "router" else [1.0, 0.0, 0.0, 0.0]
    series = {"t": [1.0, 2.0, 3.0], **{f"r{i}": [s, s, s] for i, s in enumerate(shares)}}
    return StepRun(path, 0, 100, {"200": 100 - unanswered}, unanswered, 50.0, shares, settle, series)


def _steady(subject: str, p99_ms: float, refused: int = 0) -> SteadyRun:
    replicas = 1 if subject == "one replica" else 4
    return SteadyRun(subject, 0, replicas, 128.0 * replicas, 1000, 1000 - refused, refused, 0, 50.0, p99_ms)


def _keepalive(settle: float | None = 0.6, router_p99_ms: float = 120.0, refused: int = 0) -> KeepaliveResult:
    options = {"replicas": 4, "utilisation": 0.8, "rate_rps": 400, "connections": 32, "step_s": 12,
               "scale_at_s": 2, "sample_s": 0.25, "window_s": 1, "timeout_s": 30, "repeats": 1,
               "steady_s": 8, "warmup_s": 2}  # fmt: skip
    return KeepaliveResult(
        META,
        options,
        [_step("service", [None, None, None]), _step("router", [0.4, settle, 0.5])],
        [_steady("one replica", 100.0), _steady("service", 300.0), _steady("router", router_p99_ms, refused)],
    )


def test_the_keepalive_goals_are_met_or_missed_as_the_issue_states_them() -> None:
    assert set(verdicts(keepalive_goals(_keepalive())).values()) == {True}
    missed = verdicts(keepalive_goals(_keepalive(settle=None, router_p99_ms=151.0, refused=10)))
    assert list(missed.values()) == [False, True, False, False]


def _cost() -> CostResult:
    rounds = [CostRound(i, 0.06, 0.2, 1.0, 2.0, 5000.0, 3500.0, 100.0 + i) for i in range(3)]
    return CostResult(META, {"seconds": 3, "in_flight": 32, "repeats": 3}, rounds)


def test_router_cost_is_a_difference_and_ratios_to_direct() -> None:
    figures = cost_figures(_cost())
    assert figures["added_p50_ms"] == pytest.approx(0.14)
    assert figures["rps_ratio"] == pytest.approx(0.7)
    assert figures["per_core_rps"] == pytest.approx(1e6 / 101)
    assert set(verdicts(cost_goals(_cost())).values()) == {True}


def _zero(first_answer_s: float, lost: int = 0) -> ZeroResult:
    series = {
        "t": [0.0, 1.0, 2.0],
        "held": [0.0, 20.0, 0.0],
        "answered": [0.0, 0.0, 40.0],
        "released_t": [1.5],
    }
    run = ZeroRun(0, 40, 40 - lost, lost, 3.0, first_answer_s, 2.0, 4.5, 0.05, 20, series)
    options = {"rate_rps": 20, "seconds": 2, "poll_s": 5, "probe_s": 0.2, "hold_timeout_s": 30, "repeats": 1}
    return ZeroResult(META, options, [run])


def test_a_cold_start_is_judged_against_the_replicas_own_load_time() -> None:
    assert set(verdicts(zero_goals(_zero(4.9))).values()) == {True}
    assert list(verdicts(zero_goals(_zero(5.1, lost=1))).values()) == [False, False]


def test_the_report_is_written_and_read_back_part_by_part(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    publish(BENCHMARK, Results(keepalive=_keepalive()), tmp_path, "router")
    new = Results(cost=_cost(), zero=_zero(4.0))
    results = records.newer(new, records.read_sections(Results, path))
    assert results.keepalive == _keepalive()  # kept from the earlier run
    publish(BENCHMARK, results, tmp_path, "router")
    assert records.read_sections(Results, path) == results
    text = (tmp_path / "router.md").read_text()
    assert "Keep-alive step" in text and "Router cost" in text and "Scale from zero" in text
    assert "| requests: answered 200 / sent (sum) | 40 / 40 |" in text
    assert "NOT met" not in text and re.search(r"\bnan\b", text, re.IGNORECASE) is None
    assert json.loads(path.read_text())["cost"]["rounds"][0]["router_cpu_us"] == 100.0
    assert (tmp_path / "router-keepalive.png").stat().st_size > 10_000
    assert (tmp_path / "router-zero.png").read_bytes().startswith(b"\x89PNG")


def test_a_part_written_in_an_older_shape_is_left_out_and_the_others_read(tmp_path: Path) -> None:
    publish(BENCHMARK, Results(cost=_cost(), zero=_zero(4.0)), tmp_path, "router")
    written = json.loads((tmp_path / "router.json").read_text())
    written["cost"] = {"rounds": "an older shape"}
    (tmp_path / "router.json").write_text(json.dumps(written))
    assert records.read_sections(Results, tmp_path / "router.json") == Results(zero=_zero(4.0))
    assert records.read_sections(Results, tmp_path / "absent.json") == Results()


def test_an_unknown_part_is_refused_naming_it(run_module: RunModule) -> None:
    done = run_module("batchd.bench.router", "warmup", timeout_s=60)
    assert done.returncode == 2
    assert "part: expected one of keepalive, cost, zero, got 'warmup'" in done.stderr


@pytest.mark.slow
def test_a_smoke_sized_run_measures_the_router_cost_and_a_cold_start(
    run_module: RunModule, tmp_path: Path
) -> None:
    parts = ["cost", "zero"]
    done = run_module("batchd.bench.router", *parts, "--quick", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    results = records.read_sections(Results, tmp_path / "router.json")
    assert results.cost is not None and results.zero is not None and results.keepalive is None
    (run,) = results.zero.runs
    assert run.requests > 0 and run.lost == 0 and run.peak_held > 0
    assert (tmp_path / "router-zero.png").is_file()
