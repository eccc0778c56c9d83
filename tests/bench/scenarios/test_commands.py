"""The main scenarios, run end to end as a user runs them (real servers, loopback).

No timing is asserted: speed belongs in the benchmark's own report. What is asserted is that the
commands work, that their output is well formed, and that a failure is reported, not hidden.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

RunModule = Callable[..., subprocess.CompletedProcess[str]]  # the run_module fixture (conftest.py)


@pytest.mark.slow
def test_quick_run_of_the_trivial_scenario_writes_json_and_markdown(
    tmp_path: Path, run_module: RunModule
) -> None:
    done = run_module("batchd.bench", "--quick", "--scenarios", "trivial", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]

    result = json.loads((tmp_path / "latest.json").read_text())
    assert result["failures"] == {}
    assert result["meta"][
        "command"
    ] == "python -m batchd.bench --quick --scenarios trivial --output-dir " + str(tmp_path)
    trivial = result["scenarios"]["trivial"]
    subjects = {(p["subject"], p["mode"]) for p in trivial["points"]}
    assert subjects == {(s, m) for s in ("floor", "batched", "unbatched") for m in ("closed", "open")}
    for point in trivial["points"]:
        summary = point["summary"]
        assert summary["completed"] > 0, point
        assert summary["errors"] == 0, point["runs"][0]["error_samples"]
        assert summary["p50_ms"] <= summary["p95_ms"] <= summary["p99_ms"]
    by_subject = {p["subject"]: p["summary"] for p in trivial["points"] if p["mode"] == "closed"}
    # The batch sizes come from the replica's own /metrics and add up to what the clients were answered.
    assert set(by_subject["unbatched"]["batch_sizes"]) == {"1"}
    assert by_subject["floor"]["batch_sizes"] == {}
    assert sum(by_subject["batched"]["batch_sizes"].values()) >= 1
    assert trivial["ratios"]["batched_over_floor"] > 0
    assert trivial["subjects"]["batched"]["idle_rss_mb"] > 0
    assert trivial["subjects"]["batched"]["exit_status"] == 0  # drained and exited cleanly on SIGTERM

    markdown = (tmp_path / "latest.md").read_text()
    assert "| batched | closed, 8 clients |" in markdown
    assert "| unbatched | open," in markdown
    assert "| Trivial handler >= 50% of the bare-uvicorn floor |" in markdown
    assert "### Trivial handler" in done.stdout


def test_bad_options_are_refused_with_the_value(run_module: RunModule) -> None:
    done = run_module("batchd.bench", "--repeats", "0", timeout_s=60)
    assert done.returncode == 2
    assert "--repeats: expected 1 or more, got 0" in done.stderr
