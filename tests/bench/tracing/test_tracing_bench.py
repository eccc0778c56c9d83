"""The tracing benchmark's figures from synthetic rounds (ratios paired by repeat, the goals), its
report read back from its JSON, its command line, and one smoke-sized run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from batchd.bench.kit import records
from batchd.bench.kit.command import publish
from batchd.bench.kit.goals import verdicts
from batchd.bench.kit.records import RunRecord
from batchd.bench.tracing.__main__ import BENCHMARK
from batchd.bench.tracing.analysis import Results, Round, SpanCost, Stored, failure, figures, goals
from tests.bench.conftest import RunModule

META = RunRecord("2026-01-01 00:00 UTC", "test machine", "python -m batchd.bench.tracing")
OPTIONS = {"repeats": 2, "seconds": 5.0, "warmup_s": 1.0, "adder_clients": 32, "minilm_clients": 32}


def _round(mode: str, repeat: int, rps: float, router_us: float = 100.0, errors: int = 0) -> Round:
    return Round("adder", mode, repeat, 32, int(rps * 5), errors, rps, 10.0, 20.0, router_us, 50.0, 5.0)


def _results(
    hundred: tuple[float, float] = (960.0, 1900.0), one: tuple[float, float] = (995.0, 1990.0)
) -> Results:
    rounds = [
        _round("off", 0, 1000.0),
        _round("100%", 0, hundred[0], router_us=130.0),
        _round("1%", 0, one[0]),
        _round("off", 1, 2000.0),  # a faster minute: the ratios pair each repeat with its own
        _round("100%", 1, hundred[1], router_us=130.0),
        _round("1%", 1, one[1]),
    ]
    stored = [Stored("adder", "100%", 3000, 3, ["adder-100pct", "router-adder-100pct"])]
    stored.append(Stored("adder", "1%", 3000, 31, ["adder-1pct"]))
    spans = SpanCost([90.0], [15.0], [70.0], [14.0])
    return Results(META, OPTIONS, rounds, stored, spans)


def test_ratios_pair_each_setting_with_tracing_off_in_the_same_repeat() -> None:
    by_mode = {f.mode: f for f in figures(_results())}
    assert by_mode["100%"].rps_ratio == pytest.approx((0.96 + 0.95) / 2)
    assert by_mode["1%"].rps_ratio == pytest.approx(0.995)
    assert by_mode["100%"].router_cpu_ratio == pytest.approx(1.3)
    assert by_mode["100%"].backend_cpu_us == 5.0


def test_the_goals_are_met_or_missed_as_the_issue_states_them() -> None:
    assert set(verdicts(goals(_results())).values()) == {True}
    missed = verdicts(goals(_results(hundred=(900.0, 1800.0), one=(980.0, 1990.0))))
    assert list(missed.values()) == [False, False]


def test_a_run_with_errors_or_no_rounds_fails_naming_them() -> None:
    assert failure(_results()) is None
    assert failure(Results(META, OPTIONS)) == "no round was measured"
    broken = Results(META, OPTIONS, [_round("off", 0, 1000.0, errors=3)])
    assert failure(broken) == "adder off #0: 3 errors"


def test_the_report_is_written_and_read_back(tmp_path: Path) -> None:
    publish(BENCHMARK, _results(), tmp_path, "tracing")
    assert records.read_sections(Results, tmp_path / "tracing.json") == _results()
    text = (tmp_path / "tracing.md").read_text()
    assert "| adder | 100% | 1,430 | 0.955 |" in text
    assert "31 traces stored of about 3,000 requests sent (1.03%)" in text
    assert "| a request's two spans made and ended | 90.0 | 15.0 | 6.0 |" in text
    assert "NOT met" not in text and re.search(r"\bnan\b", text, re.IGNORECASE) is None
    assert (tmp_path / "tracing.png").read_bytes().startswith(b"\x89PNG")


def test_an_unknown_model_is_refused_naming_it(run_module: RunModule) -> None:
    done = run_module("batchd.bench.tracing", "--models", "gpt5", timeout_s=60)
    assert done.returncode == 2
    assert "--models: invalid choice: 'gpt5'" in done.stderr


@pytest.mark.slow
def test_a_smoke_sized_run_measures_every_setting_and_reads_jaeger_back(
    run_module: RunModule, tmp_path: Path
) -> None:
    done = run_module("batchd.bench.tracing", "--quick", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    results = records.read_sections(Results, tmp_path / "tracing.json")
    assert {r.mode for r in results.rounds} == {"off", "100%", "1%"}
    assert all(r.requests > 0 and r.router_cpu_us > 0 and r.replica_cpu_us > 0 for r in results.rounds)
    hundred, one = results.stored
    assert hundred.traces >= 3 and len(hundred.services) == 2  # router, replica (with its batch)
    assert 0 < one.traces < one.requests
    assert (tmp_path / "tracing.png").is_file()
