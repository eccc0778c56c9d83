"""The rollouts benchmark's figures mean what they say, and its report draws from them.

The benchmark itself runs three fresh releases on the test cluster (minutes each), so it is run
by hand (`python -m batchd.bench.rollouts`), not here; what it computes from what clients saw
is checked on outcomes made up for it.
"""

from __future__ import annotations

from pathlib import Path

from batchd.bench.kit.goals import verdicts
from batchd.bench.kit.records import RunRecord
from batchd.bench.rollouts.analysis import Results, goals, subject_run
from batchd.bench.rollouts.report import draw_chart, to_markdown
from batchd.bench.rollouts.workload import QUICK, subject_manifest
from batchd.testing.traffic import Outcome


def outcomes(failing_from_s: float | None, until_s: float | None, latency_s: float = 0.01) -> list[Outcome]:
    """Ten requests a second for 30 s; every third fails between `failing_from_s` and `until_s`."""
    made = []
    for n in range(300):
        sent = n / 10
        failing = (
            failing_from_s is not None and sent >= failing_from_s and (until_s is None or sent < until_s)
        )
        made.append(Outcome(sent, latency_s, "router", 422 if failing and n % 3 == 0 else 200))
    return made


def test_failures_are_counted_after_the_ship_with_when_they_stopped() -> None:
    run = subject_run(outcomes(12.0, 15.0), 10.0, [(0.0, 10.0), (6.0, 0.0)], "RolledBack")
    assert run.failed_after == 10 and run.requests_after == 200
    assert run.last_failure_s is not None and 4.5 <= run.last_failure_s < 5
    assert not run.still_failing
    assert run.error_rate[3] > 0 and run.error_rate[10] == 0
    rolling = subject_run(outcomes(12.0, None), 10.0, [], "none")
    assert rolling.still_failing and rolling.failed_after == 60


def test_the_goals_compare_the_canary_with_the_rolling_update(tmp_path: Path) -> None:
    canary = subject_run(outcomes(12.0, 12.6), 10.0, [(0.0, 10.0)], "RolledBack")
    good = subject_run(outcomes(None, None), 10.0, [(0.0, 10.0), (20.0, 0.0)], "Promoted")
    rolling = subject_run(outcomes(12.0, None), 10.0, [], "none")
    results = Results(
        RunRecord.now("test", []), QUICK, {"rolling": [rolling], "canary": [canary], "canary-good": [good]}
    )
    assert canary.failed_after * 20 <= rolling.failed_after
    assert all(verdicts(goals(results)).values()), goals(results)
    markdown = to_markdown(results)
    assert "still failing at the end" in markdown and "| canary-good |" in markdown
    draw_chart(results, tmp_path / "rollouts.png")
    assert (tmp_path / "rollouts.png").stat().st_size > 0


def test_the_subjects_ship_the_revisions_they_say() -> None:
    rolling, canary, good = (
        subject_manifest(subject, QUICK, 2)["spec"] for subject in ("rolling", "canary", "canary-good")
    )
    assert rolling["rollout"]["strategy"] == "rolling" and canary["rollout"]["strategy"] == "canary"
    assert canary["rollout"]["steps"][0]["traffic_percent"] == QUICK.first_percent
    assert (
        rolling["model"]["init_kwargs"]["fail_percent"]
        == canary["model"]["init_kwargs"]["fail_percent"]
        == 30
    )
    assert good["model"]["init_kwargs"]["fail_percent"] == 0
    assert subject_manifest("canary", QUICK, 1)["spec"]["model"]["init_kwargs"]["fail_percent"] == 0
