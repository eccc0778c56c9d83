"""The priority benchmark: its figures from made-up runs, and a smoke-sized run on real replicas."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from batchd.bench.priority.analysis import jain
from tests.bench.conftest import RunModule


def test_jains_index_is_one_for_equal_shares_and_one_over_n_when_one_takes_everything() -> None:
    assert jain([80.0, 80.0]) == 1.0
    assert jain([160.0, 0.0]) == 0.5
    assert jain([150.0, 15.0]) == pytest.approx(165**2 / (2 * (150**2 + 15**2)))
    assert math.isnan(jain([0.0, 0.0]))


@pytest.mark.slow
def test_a_smoke_sized_run_serves_high_first_and_both_callers_alike_and_writes_its_figures(
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
    assert "| priority |" in (tmp_path / "priority.md").read_text()
    assert (tmp_path / "priority.png").read_bytes().startswith(b"\x89PNG")
