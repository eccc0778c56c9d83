"""The priority benchmark: its figures from made-up runs, and a smoke-sized run on real replicas."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from batchd.bench.kit.records import RunRecord
from batchd.bench.priority.__main__ import failure
from batchd.bench.priority.analysis import (
    ClassRun,
    EqualRun,
    GenerationRun,
    PriorityRun,
    Results,
    StreamedRun,
    jain,
)
from batchd.bench.priority.workload import QUICK
from tests.bench.conftest import RunModule


def test_jains_index_is_one_for_equal_shares_and_one_over_n_when_one_takes_everything() -> None:
    assert jain([80.0, 80.0]) == 1.0
    assert jain([160.0, 0.0]) == 0.5
    assert jain([150.0, 15.0]) == pytest.approx(165**2 / (2 * (150**2 + 15**2)))
    assert math.isnan(jain([0.0, 0.0]))


def test_equal_classes_are_judged_by_what_each_was_served() -> None:
    def served(answered: int) -> ClassRun:
        return ClassRun(offered=400, answered=answered, refused=400 - answered, p50_ms=1.0, p99_ms=2.0)

    assert EqualRun(served(300), served(250), 0, 0).served_ratio == pytest.approx(1.2)
    assert EqualRun(served(1194), served(0), 0, 597).served_ratio == math.inf


def test_a_run_fails_only_where_a_load_got_no_answer_at_all() -> None:
    answered = ClassRun(offered=10, answered=10, refused=0, p50_ms=1.0, p99_ms=2.0)

    def streamed(count: int) -> StreamedRun:
        return StreamedRun(offered=10, answered=count, refused=10 - count, shed=0, p50_ms=1.0, p99_ms=2.0)

    def results(generation: GenerationRun) -> Results:
        meta = RunRecord("2026-11-29 00:00 UTC", "2 cores", "python -m batchd.bench.priority")
        priority = {"first_come": [PriorityRun(answered, answered, answered)]}
        return Results(meta, QUICK, 100.0, priority, {}, generation={"first_come": [generation]})

    # First come: the sheddable class may hold the queue for the whole mix, and that is a finding.
    assert failure(results(GenerationRun(streamed(10), streamed(0), streamed(3)))) is None
    assert failure(results(GenerationRun(streamed(0), streamed(0), streamed(0)))) == (
        "a token-level load got no answer at all"
    )


@pytest.mark.slow
def test_a_smoke_sized_run_serves_high_first_equals_alike_sheds_the_sheddable_and_writes_its_figures(
    run_module: RunModule, tmp_path: Path
) -> None:
    done = run_module("batchd.bench.priority", "--quick", "--output-dir", str(tmp_path), timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "priority.json").read_text())
    (ranked,) = results["priority"]["priority"]
    (first_come,) = results["priority"]["first_come"]
    # At twice the capacity the low class takes every 503, and high waits little, under priority.
    assert ranked["high"]["refused"] == 0 and ranked["low"]["refused"] > 0
    assert ranked["high"]["p99_ms"] < ranked["low"]["p50_ms"]
    assert first_come["high"]["refused"] > 0  # first come: high is refused with everyone else
    (fair,) = results["fairness"]["priority"]
    assert fair["light_rps"] > 0.45 * (fair["light_rps"] + fair["heavy_rps"])
    (equal,) = results["equal"]["priority"]  # equals take turns, and neither takes the other's place
    assert equal["gold"]["answered"] > 0 and equal["silver"]["answered"] > 0
    assert equal["gold_displaced"] == equal["silver_displaced"] == 0
    (dead,) = results["dead"]["priority"]  # the dead hold no place
    assert dead["gave_up"] > 0 and dead["live_refused"] == 0
    (generation,) = results["generation"]["priority"]  # the high class streams; the sheddable one is shed
    assert generation["high"]["answered"] == generation["high"]["offered"] > 0
    assert generation["bulk"]["shed"] > 0
    assert "| priority |" in (tmp_path / "priority.md").read_text()
    assert (tmp_path / "priority.png").read_bytes().startswith(b"\x89PNG")
