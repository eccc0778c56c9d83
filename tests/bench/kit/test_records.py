"""Results go to JSON as typed dataclasses, with a missing figure as null, and come back as NaN."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from batchd.bench.kit.records import RunRecord, none_to_nan, to_json, write_json
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
    assert RunRecord.from_json(data["record"]) == RunRecord("today", "here", "python -m x")
    latency = none_to_nan(data["points"][0]["latency"])
    again = LatencySummary(**latency)
    assert all(math.isnan(value) for value in (again.p50_ms, again.p95_ms, again.p99_ms, again.max_ms))


def test_a_figure_that_was_measured_is_kept_as_is() -> None:
    summary = LatencySummary.of([0.010, 0.020])
    assert to_json(summary)["p50_ms"] == summary.p50_ms == 15.0


def test_a_run_record_says_the_command_as_a_user_types_it() -> None:
    record = RunRecord.now("batchd.bench.demo", ["--requests", "8", "a b"])
    assert record.command == "python -m batchd.bench.demo --requests 8 'a b'"
    assert "cores" in record.machine and record.date.endswith("UTC")
