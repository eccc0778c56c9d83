"""Results go to JSON as typed dataclasses, with a missing figure as null, and come back as NaN."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from batchd.bench.kit.records import RunRecord, from_json, to_json, write_json
from batchd.bench.kit.stats import LatencySummary


@dataclass(frozen=True)
class Point:
    label: str
    latency: LatencySummary
    rates: tuple[float, ...]


def test_a_result_dataclass_round_trips_through_json_without_nan(tmp_path: Path) -> None:
    point = Point("batched", LatencySummary.of([]), (1.0, math.inf))
    path = tmp_path / "result.json"
    write_json(path, {"record": RunRecord("today", "here", "python -m x"), "points": [point]})

    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data["points"][0]["latency"]["p99_ms"] is None and data["points"][0]["rates"] == [1.0, None]
    assert from_json(RunRecord, data["record"]) == RunRecord("today", "here", "python -m x")
    again = from_json(Point, data["points"][0])
    assert again.label == "batched" and again.rates[0] == 1.0 and math.isnan(again.rates[1])
    assert all(
        math.isnan(value) for value in (again.latency.p50_ms, again.latency.p99_ms, again.latency.max_ms)
    )


@dataclass(frozen=True)
class Run:
    subject: str
    p99_ms: float
    series: dict[str, list[float | None]] | None = None
    exit_code: int | None = None


def test_reading_back_keeps_optional_figures_and_leaves_out_unknown_keys() -> None:
    run = Run("adaptive", 12.5, {"t": [0.2, None]}, exit_code=0)
    assert from_json(Run, json.loads(json.dumps(to_json(run)))) == run
    older = {"subject": "0 ms", "p99_ms": None, "a_figure_no_longer_kept": 3}
    again = from_json(Run, older)
    assert again.subject == "0 ms" and math.isnan(again.p99_ms) and again.series is None


def test_a_figure_that_was_measured_is_kept_as_is() -> None:
    summary = LatencySummary.of([0.010, 0.020])
    assert to_json(summary)["p50_ms"] == summary.p50_ms == 15.0


def test_a_run_record_says_the_command_as_a_user_types_it() -> None:
    record = RunRecord.now("batchd.bench.demo", ["--requests", "8", "a b"])
    assert record.command == "python -m batchd.bench.demo --requests 8 'a b'"
    assert "cores" in record.machine and record.date.endswith("UTC")
