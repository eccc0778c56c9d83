"""The adaptive batching benchmark runs end to end in smoke size, and its definitions mean what they say.

Nothing about speed is asserted (which subject wins is the benchmark's own report): only the
report's shape, and the arithmetic of the loads and the verdicts on made-up figures.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from batchd.bench.adaptive.__main__ import BENCHMARK
from batchd.bench.adaptive.analysis import Figures, verdicts
from batchd.bench.adaptive.workload import ADAPTIVE, BURSTY, QUICK, Options, schedule_for, steady
from batchd.bench.kit.command import parse_args
from batchd.bench.kit.goals import verdicts as met_by_name

RunModule = Callable[..., subprocess.CompletedProcess[str]]  # the run_module fixture (conftest.py)


def test_a_steady_load_warms_up_then_measures_at_its_rate() -> None:
    schedule = steady(100.0, warmup_s=1.0, duration_s=20.0, rng=random.Random(1), arrivals="poisson")
    dues = schedule.dues
    assert list(dues) == sorted(dues) and dues[0] >= 0 and dues[-1] < 21.0
    measured = [due for due in dues if due >= schedule.measure_from_s]
    assert 1800 < len(measured) < 2200  # 100/s for 20 s, Poisson
    uniform = steady(10.0, warmup_s=0.0, duration_s=1.0, rng=random.Random(1), arrivals="uniform")
    assert [round(due, 6) for due in uniform.dues] == [i / 10 for i in range(10)]


def test_the_same_seed_gives_every_subject_the_same_arrivals() -> None:
    options = Options()
    first = schedule_for("50%", 200.0, options, random.Random("12-costcurve-50%-0"))
    again = schedule_for("50%", 200.0, options, random.Random("12-costcurve-50%-0"))
    assert first == again


def test_a_bursty_load_is_on_then_off() -> None:
    options = Options(burst_on_s=2.0, burst_off_s=2.0, burst_cycles=3, burst_fraction=1.2, arrivals="uniform")
    schedule = schedule_for(BURSTY, 100.0, options, random.Random(1))
    assert schedule.measure_from_s == 0 and schedule.measured_s == 12.0
    assert all(due % 4.0 < 2.0 for due in schedule.dues)  # nothing in the off phases
    assert len(schedule.dues) == 3 * 240  # 120/s for 2 s, three times


def test_longer_runs_where_a_rate_would_measure_too_few_requests() -> None:
    options = Options(duration_s=10.0, min_requests=600, warmup_s=0.0, arrivals="uniform")
    schedule = schedule_for("10%", 300.0, options, random.Random(1))  # 30/s
    assert schedule.measured_s == pytest.approx(20.0)


def _summary(
    p99: dict[str, list[float]], throughput: dict[str, list[float]]
) -> dict[str, dict[str, Figures]]:
    loads = Options().loads
    return {
        subject: {
            load: Figures(p99_ms=p99[subject][i], throughput_rps=throughput[subject][i])
            for i, load in enumerate(loads)
        }
        for subject in p99
    }


def test_verdicts_compare_with_the_best_fixed_window_at_each_load_and_on_the_mix() -> None:
    options = Options()
    flat = [100.0] * 5
    p99 = {
        "0 ms": [50.0, 60.0, 100.0, 200.0, 400.0],
        "2 ms": [52.0, 61.0, 95.0, 190.0, 420.0],
        "10 ms": [60.0, 65.0, 99.0, 180.0, 410.0],
        "50 ms": [100.0, 100.0, 120.0, 185.0, 390.0],
        ADAPTIVE: [50.0, 70.0, 90.0, 150.0, 300.0],
    }
    tput = {subject: list(flat) for subject in p99}
    tput[ADAPTIVE] = [96.0, 94.0, 100.0, 100.0, 100.0]
    verdict = verdicts(_summary(p99, tput), options)
    per_load = verdict.per_load
    assert per_load["10%"].best_fixed_p99 == "0 ms" and per_load["10%"].p99_met
    assert not per_load["50%"].p99_met  # 70 > 1.1 x 60
    assert per_load["10%"].throughput_met and not per_load["50%"].throughput_met  # 94 < 0.95 x 100
    assert met_by_name(verdict.goals) == {
        "p99 within 10% of the best fixed window's, at every load": False,
        "throughput within 5% of the best fixed window's, at every load": False,
        "beats every fixed window on the mix (mean of p99 / best p99 over the loads)": True,
    }
    # The mix weighs each load the same: p99 over the best p99 of any subject at that load.
    assert math.isclose(verdict.mix_score[ADAPTIVE], (50 / 50 + 70 / 60 + 1 + 1 + 1) / 5)
    assert math.isclose(verdict.mix_score["0 ms"], (1 + 1 + 100 / 90 + 200 / 150 + 400 / 300) / 5)


@pytest.mark.slow
def test_quick_run_reports_every_subject_at_every_load_with_a_chart(
    tmp_path: Path, run_module: RunModule
) -> None:
    # Two fixed windows and two open-loop rates (plus the bursty load) of the quick sizes: every
    # kind of subject and load, in a third of the time of the quick run's full grid.
    narrowed = ["--windows-ms", "0", "10", "--fractions", "0.1", "0.8"]
    done = run_module(
        "batchd.bench.adaptive", "--quick", *narrowed, "--output-dir", str(tmp_path), timeout_s=400
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    report = json.loads((tmp_path / "adaptive.json").read_text())
    assert list(report["models"]) == ["costcurve"]
    result = report["models"]["costcurve"]
    assert result["meta"]["command"] == (
        f"python -m batchd.bench.adaptive --quick {' '.join(narrowed)} --output-dir {tmp_path}"
    )
    options = dataclasses.replace(QUICK, windows_ms=(0.0, 10.0), fractions=(0.1, 0.8))
    assert result["capacity_rps"] > 0 and result["objective_s"] > 0
    assert set(result["summary"]) == set(options.subjects)
    for subject in options.subjects:
        assert set(result["summary"][subject]) == set(options.loads)
        for load in options.loads:
            (run,) = result["runs"][subject][load]
            assert run["errors"] == 0 and run["completed"] == run["offered"] > 0
            assert run["batches"] > 0 and run["p99_ms"] > 0
    adaptive_run = result["runs"][ADAPTIVE]["10%"][0]
    assert {"cost_fixed_ms", "cost_per_item_ms", "planned_batch_size_median", "objective_items"} <= set(
        adaptive_run
    )
    series = result["runs"][ADAPTIVE][BURSTY][0]["series"]
    assert len(series["t"]) > 5 and {len(values) for values in series.values()} == {len(series["t"])}
    assert set(result["verdicts"]["per_load"]) == set(options.loads)
    assert len(result["verdicts"]["goals"]) == 3
    assert all(isinstance(goal["met"], bool) for goal in result["verdicts"]["goals"])
    assert set(result["verdicts"]["mix_score"]) == set(options.subjects)

    markdown = (tmp_path / "adaptive.md").read_text()
    assert "| load | offered req/s | 0 ms | 10 ms | adaptive |" in markdown
    assert "![p99 against arrival rate](adaptive.png)" in markdown
    assert (tmp_path / "adaptive.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--fractions", "0", "0.5"], "--fractions"),
        (["--windows-ms", "-2"], "--windows-ms"),
        (["--burst-cycles", "0"], "--burst-cycles"),
    ],
)
def test_bad_options_are_refused_naming_the_option(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(BENCHMARK, argv)
    assert exited.value.code == 2 and named in capsys.readouterr().err
