"""The autoscaling benchmark runs end to end in smoke size, and its definitions mean what they say.

No timing is asserted beyond what the set-up makes certain (one fixed replica cannot serve 4x its
capacity; an autoscaled one adds replicas): speed belongs in the benchmark's own report.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from batchd.bench.autoscaling.__main__ import BENCHMARK, measure
from batchd.bench.autoscaling.analysis import Sample, analyse, held_from
from batchd.bench.autoscaling.workload import Options, Step
from batchd.bench.kit.command import main
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.started import Cluster
from batchd.testing.traffic import Outcome

RunModule = Callable[..., subprocess.CompletedProcess[str]]  # the run_module fixture (conftest.py)


def test_carried_is_the_first_moment_after_which_the_condition_holds_to_the_end() -> None:
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert held_from(times, [True, False, True, False, True, True], 1.0, 5.0) == 3.0
    assert held_from(times, [True, True, True, True, True, False], 1.0, 5.0) is None
    assert held_from(times, [False, True, True, True, True, True], 0.0, 5.0) == 1.0


def test_analyse_counts_refusals_apart_from_latency_and_lost_requests_loudly() -> None:
    options = Options(step=Step(low_rps=1, high_rps=10, before_s=2, step_s=2, after_s=2), sample_s=1)
    samples = [Sample(float(t), 1 if t < 3 else 4, 1 if t < 3 else 4, 0, 0) for t in range(7)]
    outcomes = [
        Outcome(1.2, 0.1, "e", 200),
        Outcome(1.5, 0.1, "e", 200),
        Outcome(2.5, 5.0, "e", 200),  # in the step, slow
        Outcome(2.6, 0.001, "e", 503, retry_after="1"),  # refused: an answer, not a latency
        Outcome(3.5, 0.1, "e", 200),
        Outcome(4.5, 0.0, "e", None, error="reset"),  # lost
    ]
    figures = analyse("autoscaled", options, samples, outcomes, []).figures
    assert figures.refused_503_in_step == 1
    assert figures.unanswered == 1 and figures.unanswered_examples[0]["error"] == "reset"
    assert math.isclose(figures.idle_p99_ms, 100, rel_tol=1e-6)
    assert figures.step_p99_ms > 4000  # the 503 did not pull it down
    assert figures.scale_up_decided_s == 1.0  # the first sample after the step asking for more
    assert figures.peak_ready == 4


@pytest.mark.slow
def test_quick_step_writes_figures_for_both_subjects_and_a_chart(
    control_plane: ControlPlane, kube_node: Node, tmp_path: Path
) -> None:
    # In this process, on this worker's cluster: the command would start one of its own.
    # The published run's queue bound: at the spec's default (1,024) a replica starved by the rest
    # of the machine holds its queue past the clients' 30 s, and they get 504s.
    argv = [
        "--quick",
        "--max-queued",
        "128",
        "--output-dir",
        str(tmp_path),
        "--workdir",
        str(tmp_path / "work"),
    ]
    assert (
        main(BENCHMARK, argv, measure=functools.partial(measure, cluster=Cluster(control_plane, kube_node)))
        == 0
    )

    results = json.loads((tmp_path / "autoscaling.json").read_text())
    step = results["step"]
    assert step["meta"]["command"] == "python -m batchd.bench.autoscaling " + " ".join(argv)
    auto, fixed = step["summary"]["autoscaled"], step["summary"]["fixed"]
    assert auto["unanswered"]["value"] == 0 and fixed["unanswered"]["value"] == 0
    # The autoscaler asks for more within the smoke-sized step; whether the pods are Ready within
    # it depends on how starved the node is (the full-sized benchmark measures that).
    assert fixed["peak_ready"]["value"] == 1
    assert auto["scale_up_decided_s"]["value"] is not None and fixed["scale_up_decided_s"]["value"] is None
    for run in [*step["runs"]["autoscaled"], *step["runs"]["fixed"]]:
        series = run["series"]
        assert len(series["t"]) > 20
        assert {len(values) for values in series.values()} == {len(series["t"])}
        assert max(series["offered_rps"]) == 320
    markdown = (tmp_path / "autoscaling.md").read_text()
    assert "| step -> load carried |" in markdown and "autoscaling.png" in markdown
    assert (tmp_path / "autoscaling.png").read_bytes().startswith(b"\x89PNG")
