"""Overload at ten times capacity (shortened here; `python -m batchd.bench.overload` runs 60 s):
only 200s and 503s with Retry-After, memory flat, service back within a second."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchd.bench.kit.goals import verdicts
from batchd.bench.overload.report import goals
from batchd.bench.overload.workload import CAPACITY, run

pytestmark = pytest.mark.slow


async def test_ten_times_capacity_is_refused_cleanly_and_forgotten_at_once(tmp_path: Path) -> None:
    report = await run(duration_s=15, times=10, workdir=tmp_path)
    assert report.statuses.get("200", 0) > 0.5 * CAPACITY * 15  # it kept serving meanwhile
    assert report.statuses.get("503", 0) > 0  # and refused what it could not take
    assert verdicts(goals(report)) == dict.fromkeys(verdicts(goals(report)), True), report
